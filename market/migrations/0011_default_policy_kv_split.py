"""A new market runs dfs-auction-kv-split: the policy that meets the market's goal on the most
points of the KV sweep and the chat workload (issue 35; mechanism.policies). Markets keep the
policy they run; the console offers only the policies offered for a market."""

from django.db import migrations, models

import market.models


class Migration(migrations.Migration):
    dependencies = [
        ("market", "0010_auto_reserve_and_alerts"),
    ]

    operations = [
        migrations.AlterField(
            model_name="market",
            name="policy",
            field=models.CharField(
                default="dfs-auction-kv-split",
                help_text="The engines' ordering policy, a name in the mechanism's registry.",
                max_length=32,
                validators=[market.models.policy_known],
            ),
        ),
    ]
