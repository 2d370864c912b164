"""Text PostgreSQL cannot keep (NUL, lone surrogates) and digits Python reads but people do not
write ("1_0", "١") on the logged-in JSON API and pages: a 400 with a clear JSON error or a form
error, never a 500. Amounts are printed in fixed notation ("0.000000000", never "0E-9")."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.utils import timezone

from accounts.models import ApiKey, Invoice, Role
from accounts.money import money, money_exact
from accounts.text import MAX_JSON_DEPTH, json_problem, text_problem
from openai_api.models import BatchJob
from tests.accounts.factories import PASSWORD, market_create, tenant_create, user_create

pytestmark = pytest.mark.django_db
KEYS = "/api/tenants/acme/keys/"
NUL = "\\u0000"  # JSON escapes, written into raw bodies as they are
SURROGATE = "\\ud800"
BAD = [NUL, SURROGATE, "\\udc00"]


@pytest.fixture
def admin_client(client):
    acme = tenant_create("acme")
    market_create()
    user_create("a_admin", tenant=acme, role=Role.ADMIN)
    client.raise_request_exception = False  # a 500 is an answer to assert on, not an error
    assert client.login(username="a_admin", password=PASSWORD)
    return client


def post_raw(client, path: str, body: str):
    return client.post(path, body.encode(), content_type="application/json")


def json_error(response, status: int) -> dict:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"] == "application/json"
    return response.json()


# --- the key API ------------------------------------------------------------------------------


@pytest.mark.parametrize("escape", BAD)
@pytest.mark.parametrize(
    ("template", "field"),
    [
        ('{"name": "ci {bad} bot"}', "name"),
        ('{"name": "{bad}"}', "name"),
        ('{"name": "ok", "budget_limit": "1{bad}"}', "budget_limit"),
        ('{"name": "ok", "budget_period": "{bad}"}', "budget_period"),
        ('{"name": "ok", "x{bad}": 1}', "body"),
        ('{"name": ["{bad}"]}', "name[0]"),
    ],
)
def test_the_key_api_refuses_bad_text_naming_the_field(admin_client, template, field, escape):
    response = post_raw(admin_client, KEYS, template.replace("{bad}", escape))
    body = json_error(response, 400)
    assert field in body["fields"]
    assert body["error"].startswith(field)
    assert not ApiKey.objects.exists()


@pytest.mark.parametrize(
    "raw",
    ["[" * 100_000 + "]" * 100_000, '{"name": ' + "[" * 40 + "]" * 40 + "}", "{", "[1]", '"x"'],
)
def test_the_key_api_refuses_bodies_too_deep_or_not_objects(admin_client, raw):
    body = json_error(post_raw(admin_client, KEYS, raw), 400)
    assert body["error"]
    assert not ApiKey.objects.exists()


@pytest.mark.parametrize("limit", ["1_0", "١٠", "１０", "𝟏", "٠.٥", "+1 0"])
def test_the_key_api_reads_ascii_amounts_only(admin_client, limit):
    body = json_error(
        admin_client.post(
            KEYS, {"name": "k", "budget_limit": limit}, content_type="application/json"
        ),
        400,
    )
    assert "budget_limit" in body["fields"]
    assert not ApiKey.objects.exists()
    created = admin_client.post(
        KEYS, {"name": "k", "budget_limit": "10"}, content_type="application/json"
    )
    assert created.status_code == 201
    assert created.json()["budget"]["limit"] == "10.000000000"


def test_the_key_page_shows_a_form_error_for_a_nul(admin_client):
    response = admin_client.post("/tenants/acme/keys/", {"name": "bot\x00"})
    assert response.status_code == 200
    assert "Null characters are not allowed." in response.content.decode()
    assert not ApiKey.objects.exists()


# 4,301 digits: past Python's integer-conversion limit (issue 30: a 500 as an HTML page).
@pytest.mark.parametrize("hours", ["١٢", "1_2", "１２", "%00", "12%00", "9" * 4301])
def test_usage_hours_are_ascii_digits_only(admin_client, hours):
    body = json_error(admin_client.get(f"/api/tenants/acme/usage/?hours={hours}"), 400)
    assert "hours" in body["error"]


def test_usage_hours_may_be_zero_padded(admin_client):
    usage = admin_client.get("/api/tenants/acme/usage/?hours=" + "0" * 4300 + "2").json()
    assert len(usage["spend_per_hour"]) == 2


def test_usage_amounts_are_fixed_point_even_when_zero(admin_client):
    usage = admin_client.get("/api/tenants/acme/usage/?hours=2").json()
    assert [h["amount"] for h in usage["spend_per_hour"]] == ["0.000000000", "0.000000000"]


# --- the batch pages --------------------------------------------------------------------------


def line(custom_id: str = "x", **body) -> dict:
    body = {"model": "org/test-llm", "prompt": "Once", "max_tokens": 4, "bid": 0.01} | body
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body}


@pytest.mark.parametrize("escape", BAD)
@pytest.mark.parametrize(
    ("bad_line", "field"),
    [
        (line("PLACEHOLDER"), "custom_id"),
        (line(prompt="PLACEHOLDER"), "body.prompt"),
        (line(model="PLACEHOLDER"), "body.model"),
        (line(user="PLACEHOLDER"), "body.user"),
    ],
)
def test_a_batch_file_with_bad_text_is_refused_on_the_dashboard(
    admin_client, bad_line, field, escape
):
    text = json.dumps(line("good")) + "\n" + json.dumps(bad_line).replace("PLACEHOLDER", escape)
    upload = SimpleUploadedFile("b.jsonl", text.encode(), content_type="application/jsonl")
    response = admin_client.post("/tenants/acme/batches/", {"input": upload}, follow=True)
    assert response.status_code == 200
    page = response.content.decode()
    assert "Batch refused, nothing was submitted. line 2: " in page
    assert field in page
    assert not BatchJob.objects.exists()


@pytest.mark.parametrize("kind", ["output", "errors"])
@pytest.mark.parametrize("public_id", ["%00", "batch_%00x"])
def test_a_batch_download_with_a_nul_in_its_id_is_400(admin_client, kind, public_id):
    response = admin_client.get(f"/tenants/acme/batches/{public_id}/{kind}/")
    assert response.status_code == 400


def test_a_batch_download_of_an_unknown_id_is_still_404(admin_client):
    assert admin_client.get("/tenants/acme/batches/batch_nope/output/").status_code == 404


# --- amounts printed --------------------------------------------------------------------------


def test_the_invoices_command_prints_a_zero_total_in_fixed_notation():
    tenant_create("idle")  # no spend at all: a zero invoice
    out = StringIO()
    last_month = timezone.now().replace(day=1) - timedelta(days=1)
    call_command("invoices_generate", "--month", last_month.strftime("%Y-%m"), stdout=out)
    invoice = Invoice.objects.get()
    assert invoice.total == 0
    assert out.getvalue() == f"{invoice.number}: $0.000000000\n"


# --- the rules themselves ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "bad"),
    [("plain", False), ("emoji \U0001f600 ok", False), ("tab\tand\nnewline", False),
     ("\x00", True), ("a\x00b", True), ("\ud800", True), ("x\udfff", True), ("\ud83d", True)],
)  # fmt: skip
def test_text_problem_refuses_nul_and_lone_surrogates_only(text, bad):
    assert (text_problem(text) is not None) is bad


def test_json_problem_names_the_path_of_the_first_bad_string():
    value = {"a": [{"b": "ok"}, {"c": "x\x00"}], "d": "\ud800"}
    assert json_problem(value)[0] == "a[1].c"
    assert json_problem({"ok": {"k\x00": 1}})[0] == "ok"  # a bad key: its object is named
    assert json_problem({"fine": ["yes", 1, None, 2.5]}) is None
    deep: list = []
    inner = deep
    for _ in range(MAX_JSON_DEPTH):
        inner.append([])
        inner = inner[0]
    assert json_problem(deep) is not None
    assert json_problem(deep[0]) is None  # exactly at the limit


@pytest.mark.parametrize("value", ["1_0", "١", "１", "+1", ".5", "NaN", "Infinity", "1e30",
                                   "1e999999999999999999"])  # fmt: skip
def test_amounts_typed_as_text_are_ascii_decimals_within_range(value):
    with pytest.raises(ValueError):  # not decimal.InvalidOperation or Overflow: a clear refusal
        money_exact(value)
    with pytest.raises(ValueError):
        money(value)


def test_huge_engine_floats_are_refused_not_crashed_on():
    with pytest.raises(ValueError):
        money(1e300)
    assert money("-0") == Decimal(0) and money_exact(" 2.5 ") == Decimal("2.5")
