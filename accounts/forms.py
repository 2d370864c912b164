"""Forms of the tenant pages and their JSON twins (the same validation for both)."""

from decimal import Decimal

from django import forms

from accounts.models import Period
from accounts.money import MONEY_DIGITS, MONEY_PLACES


class ApiKeyCreateForm(forms.Form):
    """A new API key: a name, and optionally a budget of its own (dollars per period)."""

    name = forms.CharField(max_length=100)
    budget_limit = forms.DecimalField(
        required=False,
        min_value=Decimal(0),
        max_digits=MONEY_DIGITS,
        decimal_places=MONEY_PLACES,
        help_text="Optional: dollars per period this key may spend, on top of the tenant's budget.",
    )
    budget_period = forms.ChoiceField(choices=Period.choices, initial=Period.MONTH, required=False)

    def clean_budget_period(self) -> str:
        return self.cleaned_data.get("budget_period") or Period.MONTH
