"""Template context shared by every page: what the nav bar links to."""

from typing import Any

from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from accounts.selectors import tenants_for_user


def nav(request: HttpRequest) -> dict[str, Any]:
    """``nav_tenant``: the signed-in member's first tenant (its dashboard, invoices and keys),
    or None (anonymous visitors, operators who belong to no tenant). Read only when a page
    uses it: a tenant's own pages link to that tenant instead."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {"nav_tenant": None}
    return {"nav_tenant": SimpleLazyObject(lambda: tenants_for_user(user=user).first())}
