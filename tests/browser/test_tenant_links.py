"""The operator reaches a tenant's pages from the console (issue 48, item 3): each row of the
console's tenant table links the tenant's dashboard and invoices, and its header the list of
every tenant (``/tenants/``), whose rows link each tenant's pages."""

from __future__ import annotations

import pytest

from tests.browser.conftest import LiveMarket, login, screenshot

pytestmark = pytest.mark.browser


def test_the_operator_goes_from_the_consoles_tenants_to_their_invoices_and_dashboards(
    page, quiet_market: LiveMarket
):
    server = quiet_market.server
    login(page, server, "operator", f"/console/markets/{quiet_market.market.slug}/")
    page.wait_for_selector("#tenants tbody tr[data-tenant=acme]")
    links = page.eval_on_selector_all(
        "#tenants tbody tr",
        "rows => rows.map(r => [r.dataset.tenant, [...r.querySelectorAll('a')]"
        ".map(a => [a.textContent, a.getAttribute('href')])])",
    )
    assert links == [
        [
            slug,
            [
                [f"Tenant {slug.upper()}", f"/tenants/{slug}/dashboard/"],
                ["Dashboard", f"/tenants/{slug}/dashboard/"],
                ["Invoices", f"/tenants/{slug}/invoices/"],
            ],
        ]
        for slug in ["acme", "globex"]
    ]
    screenshot(page, "console-tenant-links")
    page.click("#tenants tbody tr[data-tenant=globex] a:text('Invoices')")
    page.wait_for_url(f"{server.url}/tenants/globex/invoices/")
    assert "INV-globex" in page.inner_text("main")
    page.goto(f"{server.url}/console/markets/{quiet_market.market.slug}/")
    page.click("#tenants-all")
    page.wait_for_url(f"{server.url}/tenants/")
    assert page.eval_on_selector_all(
        "#tenant-list tbody tr", "rows => rows.map(r => r.dataset.tenant)"
    ) == ["acme", "globex"]
    screenshot(page, "tenant-list")
    page.click("#tenant-list tr[data-tenant=acme] a:text('Dashboard')")
    page.wait_for_url(f"{server.url}/tenants/acme/dashboard/")
