"""Telling a user's open websockets, as it happens, that its access may have changed.

A socket is authorized when it connects (``market.consumers``), but what allowed it can end: a
membership deleted (or its role changed), a user deactivated, deleted or no longer staff, a
logout (its session is gone), a password change (the user's other sessions end). Each of these
sends ``access.changed`` to the user's group (``user.<id>``) once the change has committed, and
every socket of that user re-checks its access at once and closes (4403) when it is gone.

What sends no signal (a queryset ``update()``, a session that expires or is deleted in bulk) is
caught by each socket's periodic re-check, every ``LIVE_ACCESS_RECHECK_S`` seconds. Creating a
user or a membership grants, never revokes: it sends nothing, nor does a login (``last_login``).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_out
from django.db import transaction
from django.db.models.signals import post_delete, post_save

from accounts.models import Membership
from market.live.send import group_send
from market.payloads import AccessChanged, AccessReason, user_group

# A save that only records a login changes nobody's access.
_LOGIN_ONLY = frozenset({"last_login"})


def access_changed(*, user_id: int, reason: AccessReason) -> None:
    """Send ``access.changed`` to ``user_id``'s sockets once the current transaction commits
    (at once outside one), so that their re-check reads the change."""
    payload: AccessChanged = {"kind": "access.changed", "user": user_id, "reason": reason}
    transaction.on_commit(lambda: group_send(user_group(user_id), payload))


def _membership_saved(sender: Any, instance: Membership, created: bool, **kwargs: Any) -> None:
    if not created:
        access_changed(user_id=instance.user_id, reason="membership")


def _membership_deleted(sender: Any, instance: Membership, **kwargs: Any) -> None:
    access_changed(user_id=instance.user_id, reason="membership")


def _user_saved(
    sender: Any, instance: Any, created: bool, update_fields=None, **kwargs: Any
) -> None:
    if created or (update_fields is not None and set(update_fields) <= _LOGIN_ONLY):
        return
    access_changed(user_id=instance.pk, reason="user")


def _user_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    access_changed(user_id=instance.pk, reason="user")


def _logged_out(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is not None and user.pk is not None:
        access_changed(user_id=user.pk, reason="logout")


def receivers_connect() -> None:
    """Connect the receivers above (``MarketConfig.ready``)."""
    user_model = get_user_model()
    uid = "market.live.access."
    post_save.connect(_membership_saved, sender=Membership, dispatch_uid=uid + "membership_saved")
    post_delete.connect(
        _membership_deleted, sender=Membership, dispatch_uid=uid + "membership_deleted"
    )
    post_save.connect(_user_saved, sender=user_model, dispatch_uid=uid + "user_saved")
    post_delete.connect(_user_deleted, sender=user_model, dispatch_uid=uid + "user_deleted")
    user_logged_out.connect(_logged_out, dispatch_uid=uid + "logged_out")
