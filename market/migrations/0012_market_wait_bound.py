"""A market's wait bound (seconds, 0: off): requests waiting longer are served ahead of bids
under the DFS auctions (mechanism.aging); a change of it is audited as a control change."""

from django.db import migrations, models

import market.models


class Migration(migrations.Migration):
    dependencies = [
        ("market", "0011_default_policy_kv_split"),
    ]

    operations = [
        migrations.AddField(
            model_name="market",
            name="wait_bound_s",
            field=models.FloatField(
                default=0.0,
                help_text="Requests waiting longer than this are served ahead of bids; 0 turns it off (seconds; the DFS auctions only: an age credit in steps, never money).",
                validators=[market.models.wait_bound_known],
            ),
        ),
        migrations.AlterField(
            model_name="controlchange",
            name="control",
            field=models.CharField(
                choices=[
                    ("policy", "Ordering policy"),
                    ("reserve_max", "Reserve ceiling ($/s)"),
                    ("auto_reserve", "Automatic reserve"),
                    ("alert_queue", "Queue alert (requests waiting)"),
                    ("alert_ttft_p99", "TTFT p99 alert (s)"),
                    ("wait_bound_s", "Wait bound (s)"),
                ],
                max_length=16,
            ),
        ),
        migrations.AddConstraint(
            model_name="market",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("wait_bound_s", 0),
                    models.Q(("wait_bound_s__gte", 0.5), ("wait_bound_s__lte", 3600.0)),
                    _connector="OR",
                ),
                name="market_wait_bound_off_or_in_range",
            ),
        ),
    ]
