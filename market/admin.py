from django import forms
from django.contrib import admin

from market.mechanism import POLICIES
from market.models import Market, Replica, ReserveChange
from market.services import engine_config_push_on_commit, market_reserve_set


class ReserveChangeInline(admin.TabularInline):
    model = ReserveChange
    extra = 0
    can_delete = False
    fields = ["at", "changed_by", "old", "new"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False


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
        "reserve",
        "price_input_per_mtok",
        "price_cached_input_per_mtok",
        "price_output_per_mtok",
        "is_active",
    ]
    list_filter = ["is_active", "policy"]
    search_fields = ["slug", "name", "served_model"]
    prepopulated_fields = {"slug": ["name"]}
    readonly_fields = ["hold_horizon_s"]  # renewed from the market's charges, not set by hand
    inlines = [ReplicaInline, ReserveChangeInline]

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        if db_field.name == "policy":  # a choice among the registry's policies as they are now
            return forms.ChoiceField(
                choices=[(p, p) for p in POLICIES],
                initial=db_field.default,
                help_text=db_field.help_text,
            )
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    def save_model(self, request, obj: Market, form, change: bool) -> None:
        # A reserve moved here goes through the service, so it is audited like one moved in
        # the console.
        if change and "reserve" in form.changed_data:
            new_reserve = obj.reserve
            obj.reserve = Market.objects.get(pk=obj.pk).reserve
            super().save_model(request, obj, form, change)
            market_reserve_set(market=obj, reserve=new_reserve, user=request.user)
        else:
            super().save_model(request, obj, form, change)

    def save_formset(self, request, form, formset, change: bool) -> None:
        super().save_formset(request, form, formset, change)
        if formset.model is Replica and formset.has_changed():
            # A replica added, moved or enabled gets the market's policy and reserve.
            engine_config_push_on_commit(market_id=form.instance.pk)


@admin.register(ReserveChange)
class ReserveChangeAdmin(admin.ModelAdmin):
    """The audit trail is read-only."""

    list_display = ["market", "at", "changed_by", "old", "new"]
    list_filter = ["market"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
