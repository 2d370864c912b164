from django.apps import AppConfig


class MarketConfig(AppConfig):
    name = "market"
    verbose_name = "Market"

    def ready(self) -> None:
        from market.live.access import receivers_connect

        # Open websockets hear at once when their user's access may have changed.
        receivers_connect()
