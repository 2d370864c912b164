from django import forms
from django.contrib import admin

from accounts.admin import ReadOnlyAdmin, shown, usd
from accounts.figures import exact
from market.models import ControlChange, Market, Replica, ReserveChange
from market.services import (
    engine_config_push_on_commit,
    market_alerts_set,
    market_auto_reserve_set,
    market_policy_set,
    market_reserve_max_set,
    market_reserve_set,
    market_wait_bound_set,
)
from mechanism import OFFERED, wait_bound
from mechanism.aging import WAIT_BOUND_HELP


class _AuditInline(admin.TabularInline):
    """An audit trail shown read-only: rows are written by the services, never in the admin."""

    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False


class ReserveChangeInline(_AuditInline):
    model = ReserveChange
    fields = ["at", "changed_by", "automatic", "old", "new"]
    readonly_fields = fields


class ControlChangeInline(_AuditInline):
    model = ControlChange
    fields = ["at", "changed_by", "automatic", "control", "old", "new"]
    readonly_fields = fields


# Moved through their services (audited as on the console), never saved straight from the form.
CONTROLLED = (
    "reserve_max", "reserve", "policy", "auto_reserve", "auto_reserve_target_s", "alert_queue",
    "alert_ttft_p99_s", "wait_bound_s", "wait_bound_mode",
)  # fmt: skip


class MarketAdminForm(forms.ModelForm):
    class Meta:
        model = Market
        fields = "__all__"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The rule's own words, from its constants (the model's text names them, so that a
        # change of a default needs no migration).
        help_text = f"The wait bound in force, seconds. {WAIT_BOUND_HELP}"
        self.fields["wait_bound_s"].help_text = help_text

    def clean(self):
        data = super().clean()
        reserve, ceiling = data.get("reserve"), data.get("reserve_max")
        if reserve is not None and ceiling is not None and reserve > ceiling:
            self.add_error(
                "reserve",
                f"Above the reserve ceiling ({exact(ceiling)} $/s): raise the ceiling too.",
            )
        for field in ("auto_reserve_target_s", "alert_ttft_p99_s"):
            seconds = data.get(field)
            if seconds is not None and not 0 < seconds < 1e6:
                self.add_error(field, "A number of seconds > 0.")
        return data


class ReplicaInline(admin.TabularInline):
    model = Replica
    extra = 0
    fields = ["engine_id", "url", "enabled"]


@admin.register(Market)
class MarketAdmin(admin.ModelAdmin):
    list_display = [
        "slug",
        "name",
        "served_model",
        "policy",
        shown("reserve", lambda reserve: f"{exact(reserve)} $/s"),  # as typed: every digit
        usd("price_input_per_mtok", "input per 1M tokens"),
        usd("price_cached_input_per_mtok", "cached input per 1M tokens"),
        usd("price_output_per_mtok", "output per 1M tokens"),
        "is_active",
    ]
    list_filter = ["is_active", "policy"]
    search_fields = ["slug", "name", "served_model"]
    prepopulated_fields = {"slug": ["name"]}
    readonly_fields = ["hold_horizon_s"]  # renewed from the market's charges, not set by hand
    inlines = [ReplicaInline, ReserveChangeInline, ControlChangeInline]
    form = MarketAdminForm

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        if db_field.name == "policy":  # a choice among the policies offered for a market
            return forms.ChoiceField(
                choices=[(p, p) for p in OFFERED],
                initial=db_field.default,
                help_text=db_field.help_text,
            )
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    def save_model(self, request, obj: Market, form, change: bool) -> None:
        # The reserve, its ceiling and the policy moved here go through their services, so each
        # is audited as in the console: the row is saved with their old values first.
        controlled = [f for f in CONTROLLED if f in form.changed_data]
        if not change or not controlled:
            super().save_model(request, obj, form, change)
            return
        old = Market.objects.get(pk=obj.pk)
        wanted = {f: getattr(obj, f) for f in controlled}
        for f in controlled:
            setattr(obj, f, getattr(old, f))
        super().save_model(request, obj, form, change)
        ceiling = wanted.get("reserve_max")
        # A ceiling that rises goes first (the new reserve may need it), one that falls last.
        if ceiling is not None and ceiling >= old.reserve_max:
            market_reserve_max_set(market=obj, reserve_max=ceiling, user=request.user)
        if "reserve" in wanted:
            market_reserve_set(market=obj, reserve=wanted["reserve"], user=request.user)
        if ceiling is not None and ceiling < old.reserve_max:
            market_reserve_max_set(market=obj, reserve_max=ceiling, user=request.user)
        if "policy" in wanted:
            market_policy_set(market=obj, policy=wanted["policy"], user=request.user)
        if {"wait_bound_s", "wait_bound_mode"} & set(wanted):
            mode = wanted.get("wait_bound_mode")
            if mode in (wait_bound.AUTO, wait_bound.OFF):
                market_wait_bound_set(market=obj, mode=mode, user=request.user)
            else:  # a length typed, or pinned chosen: the length pins it (0: off)
                length = wanted.get("wait_bound_s", obj.wait_bound_s)
                market_wait_bound_set(market=obj, wait_bound_s=length, user=request.user)
        if {"auto_reserve", "auto_reserve_target_s"} & set(wanted):
            market_auto_reserve_set(
                market=obj,
                enabled=wanted.get("auto_reserve", obj.auto_reserve),
                target_s=wanted.get("auto_reserve_target_s", obj.auto_reserve_target_s),
                user=request.user,
            )
        if {"alert_queue", "alert_ttft_p99_s"} & set(wanted):
            market_alerts_set(
                market=obj,
                queue=wanted.get("alert_queue", obj.alert_queue),
                ttft_p99_s=wanted.get("alert_ttft_p99_s", obj.alert_ttft_p99_s),
                user=request.user,
            )

    def save_formset(self, request, form, formset, change: bool) -> None:
        super().save_formset(request, form, formset, change)
        if formset.model is Replica and formset.has_changed():
            # A replica added, moved or enabled gets the market's policy and reserve.
            engine_config_push_on_commit(market_id=form.instance.pk)


@admin.register(ControlChange)
class ControlChangeAdmin(ReadOnlyAdmin):
    """The audit trail is read-only."""

    list_display = ["market", "at", "changed_by", "control", "old", "new"]
    list_filter = ["market", "control"]


@admin.register(ReserveChange)
class ReserveChangeAdmin(ReadOnlyAdmin):
    """The audit trail is read-only."""

    list_display = ["market", "at", "changed_by", "old", "new"]
    list_filter = ["market"]
