"""Forms of the tenant pages and their JSON twins (the same validation for both).

Text fields take text that can be kept (``accounts.text``; Django's own check covers NUL only),
amounts are ASCII decimals (``accounts.money.DECIMAL_TEXT``).
"""

from decimal import Decimal

from django import forms
from django.core.exceptions import ValidationError

from accounts.models import ApiKey, Period
from accounts.money import DECIMAL_TEXT, MONEY_DIGITS, MONEY_PLACES
from accounts.text import text_problem


def text_kept(value: str) -> None:
    """ValidationError for text that cannot be kept (a lone surrogate, from a JSON body)."""
    problem = text_problem(value)
    if problem is not None:
        raise ValidationError(f"This text {problem}.", code="invalid_text")


class DollarsField(forms.DecimalField):
    """A DecimalField that reads ASCII decimals only (Decimal() reads "1_0" as 10, and other
    scripts' digits)."""

    def to_python(self, value):  # type: ignore[no-untyped-def]
        if isinstance(value, str) and value.strip() and not DECIMAL_TEXT.fullmatch(value.strip()):
            raise ValidationError(self.error_messages["invalid"], code="invalid")
        return super().to_python(value)


class ApiKeyCreateForm(forms.Form):
    """A new API key: a name, and optionally a budget of its own (dollars per period)."""

    name = forms.CharField(max_length=100, validators=[text_kept])
    budget_limit = DollarsField(
        required=False,
        min_value=Decimal(0),
        max_digits=MONEY_DIGITS,
        decimal_places=MONEY_PLACES,
        help_text="Optional: dollars per period this key may spend, on top of the tenant's budget.",
    )
    budget_period = forms.ChoiceField(choices=Period.choices, initial=Period.MONTH, required=False)

    def clean_budget_period(self) -> str:
        return self.cleaned_data.get("budget_period") or Period.MONTH


class BatchUploadForm(forms.Form):
    """A batch job from the console: a JSONL file of requests with bids (OpenAI's batch line
    format), run with the tenant's budget (or one of its keys', and that key's budget too)."""

    input = forms.FileField(label="JSONL file", help_text="One request a line, with its bid.")
    api_key = forms.ModelChoiceField(
        queryset=None,
        required=False,
        label="API key",
        empty_label="None: the tenant's budget only",
        help_text="Optional: charge the batch to one of your API keys.",
    )

    def __init__(self, *args, tenant, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.fields["api_key"].queryset = ApiKey.objects.filter(
            tenant=tenant, revoked_at__isnull=True
        )
