# The batch models moved to the openai_api app: their tables take that app's names here, and
# openai_api 0001 records the models in its own state.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("scheduler_bridge", "0001_initial"),
    ]

    operations = [
        migrations.AlterModelTable(name="batchjob", table="openai_api_batchjob"),
        migrations.AlterModelTable(name="batchitem", table="openai_api_batchitem"),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="BatchItem"),
                migrations.DeleteModel(name="BatchJob"),
            ],
            database_operations=[],
        ),
    ]
