"""Django admin for every accounts model. The ledger and the holds are read-only here: money
moves only through the services (settlement, holds), never by hand."""

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from accounts import figures
from accounts.models import (
    ApiKey,
    Autobidder,
    AutobidderStep,
    Budget,
    BudgetCounter,
    Hold,
    Invoice,
    InvoiceLine,
    LedgerEntry,
    Membership,
    Request,
    Tenant,
)
from accounts.services.autobidder import autobidder_configure, class_setting
from accounts.services.keys import api_key_revoke


def shown(field: str, rule: Callable[[Any], str], label: str = "") -> Callable[[Any], str]:
    """A column (or read-only field) showing ``field`` by the figures' rule
    (:mod:`accounts.figures`: "$0.00784", "0.00142"), sorted by the field itself."""

    @admin.display(description=label or field.replace("_", " "), ordering=field)
    def column(obj: Any) -> str:
        return rule(getattr(obj, field))

    column.__name__ = f"{field}_shown"
    return column


def usd(field: str, label: str = "") -> Callable[[Any], str]:
    """A money column: :func:`accounts.figures.usd`."""
    return shown(field, figures.usd, label)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Viewable, never added, changed or deleted through the admin."""

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]
    fields = ["user", "role", "created_at"]
    readonly_fields = ["created_at"]


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "created_at"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", "tenant"]
    search_fields = ["user__username", "tenant__slug"]
    autocomplete_fields = ["user", "tenant"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Keys are created where their secret can be shown once (the tenant's key page), so not
    here; here they can be renamed and revoked."""

    list_display = ["name", "tenant", "display", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["tenant"]
    search_fields = ["name", "prefix", "tenant__slug"]
    fields = ["tenant", "name", "prefix", "created_by", "created_at", "last_used_at", "revoked_at"]
    readonly_fields = ["tenant", "prefix", "created_by", "created_at", "last_used_at", "revoked_at"]
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Revoke the selected keys")
    def revoke(self, request: HttpRequest, queryset) -> None:
        revoked = sum(api_key_revoke(api_key=key) for key in queryset)
        self.message_user(request, f"Revoked {revoked} key(s).")


@admin.register(Budget)
class BudgetAdmin(admin.ModelAdmin):
    list_display = [
        "tenant", "api_key", "period", usd("limit"),
        shown("soft_alert_fraction", figures.percent, "soft alert at"), "updated_at",
    ]  # fmt: skip
    list_filter = ["period", "tenant"]
    search_fields = ["tenant__slug", "api_key__name"]
    raw_id_fields = ["api_key"]


@admin.register(BudgetCounter)
class BudgetCounterAdmin(ReadOnlyAdmin):
    """Kept by the services in step with the ledger and the holds, never by hand."""

    list_display = ["tenant", "api_key", usd("held"), usd("day_spent"), usd("week_spent"),
                    usd("month_spent"), usd("spent_total")]  # fmt: skip
    list_filter = ["tenant"]


@admin.register(Hold)
class HoldAdmin(ReadOnlyAdmin):
    list_display = [
        "request_id", "tenant", "api_key", usd("amount"), usd("remaining"), "state", "created_at",
    ]  # fmt: skip
    list_filter = ["state", "tenant"]
    search_fields = ["request_id"]


@admin.register(Request)
class RequestAdmin(ReadOnlyAdmin):
    list_display = [
        "request_id", "tenant", "market", shown("bid", figures.usd_per_s), "status", "created_at",
        "finished_at",
    ]  # fmt: skip
    list_filter = ["status", "market", "tenant", "request_class"]
    search_fields = ["request_id"]
    date_hierarchy = "created_at"


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdmin):
    """The ledger is append-only: entries come from settlement, never from a person."""

    list_display = ["created_at", "tenant", "market", "request", "kind", usd("amount"), "round_id"]
    list_filter = ["kind", "market", "tenant"]
    search_fields = ["request__request_id", "round_id"]
    date_hierarchy = "created_at"


class InvoiceLineInline(admin.TabularInline):
    model = InvoiceLine
    extra = 0
    can_delete = False
    fields = ["request", "market", usd("priority_amount"), usd("tokens_amount"), usd("total")]
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(Invoice)
class InvoiceAdmin(ReadOnlyAdmin):
    """Invoices are generated from the ledger (``invoice_generate``), never edited."""

    list_display = ["tenant", "period_start", "period_end", usd("total"), "created_at"]
    list_filter = ["tenant"]
    inlines = [InvoiceLineInline]


@admin.register(InvoiceLine)
class InvoiceLineAdmin(ReadOnlyAdmin):
    list_display = [
        "invoice", "request", "market", usd("priority_amount"), usd("tokens_amount"), usd("total"),
    ]  # fmt: skip
    list_filter = ["market"]
    search_fields = ["request__request_id"]


class AutobidderForm(forms.ModelForm):
    """Each class's value or latency target checked by the service's rule (``class_setting``),
    so a malformed one is a field error, not a failed save."""

    class Meta:
        model = Autobidder
        exclude = ["mu", "exposure_factor", "spent_in_window"]
        help_texts = {
            "values": "Per request class, a value in dollars per second of waiting, or a latency "
            "target the autobidder bids the market's quote for (first token within ttft_s "
            'seconds with probability p), e.g. {"background": "0.001", "chat": {"ttft_s": 2, '
            '"p": 0.9}}.'
        }

    def clean_values(self) -> dict[str, Any]:
        values = self.cleaned_data["values"]
        if not isinstance(values, dict):
            raise forms.ValidationError('give an object of request classes, e.g. {"chat": "0.05"}')
        for name, raw in values.items():
            try:
                class_setting(name, raw)
            except ValueError as exc:
                raise forms.ValidationError(str(exc)) from None
        return values


@admin.register(Autobidder)
class AutobidderAdmin(admin.ModelAdmin):
    """Settings are edited here; the multiplier moves only by the pacing steps."""

    form = AutobidderForm

    list_display = [
        "tenant", "enabled", usd("budget"), "period", shown("mu", figures.figure),
        shown("exposure_factor", figures.figure), "updated_at",
    ]  # fmt: skip
    # The pacing state, shown by the figures' rule and never edited (excluded by the form).
    readonly_fields = [
        shown("mu", figures.figure), shown("exposure_factor", figures.figure), "spent_start",
        usd("spent_in_window"), "updated_at",
    ]  # fmt: skip

    def save_model(self, request: HttpRequest, obj: Autobidder, form, change: bool) -> None:
        """Save through the service, which validates and recounts the budget's window."""
        saved = autobidder_configure(
            tenant=obj.tenant,
            enabled=obj.enabled,
            budget=obj.budget,
            period=obj.period,
            values=obj.values,
            max_wait_s=obj.max_wait_s,
            eta=obj.eta,
            mu_max=obj.mu_max,
        )
        obj.pk = saved.pk
        obj.refresh_from_db()


@admin.register(AutobidderStep)
class AutobidderStepAdmin(ReadOnlyAdmin):
    list_display = [
        "autobidder",
        "at",
        shown("mu", figures.figure),
        usd("spent"),
        usd("target"),
        usd("window_spent"),
        shown("exposure_factor", figures.figure),
        usd("in_flight"),
        usd("uncollected"),
    ]
    list_filter = ["autobidder"]
