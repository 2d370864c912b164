"""The wait bound's help says what the bound does at its defaults (mechanism.aging: 16 steps of
up to $0.004/s per prompt token)."""

from django.db import migrations, models

import market.models


class Migration(migrations.Migration):
    dependencies = [
        ("market", "0012_market_wait_bound"),
    ]

    operations = [
        migrations.AlterField(
            model_name="market",
            name="wait_bound_s",
            field=models.FloatField(
                default=0.0,
                help_text="Seconds. A request that has waited this long ranks as if it bid $4/s more per 1,000 prompt tokens, reached in 16 steps as it waits (a credit, never money; the DFS auctions only); 0 turns it off.",
                validators=[market.models.wait_bound_known],
            ),
        ),
    ]
