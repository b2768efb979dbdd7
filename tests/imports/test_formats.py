"""The origin providers' export parsers (control_plane/imports/formats), without a database:
every fixture of tests/data/imports reproduces expected.json (tallies, created e-mails in order,
skipped records with their reasons, descope's organizations and memberships), ``detect`` refuses
what is not the provider's, and the files found in the wild parse (BOM, quoted newlines, extra or
reordered columns, nulls, mixed case, gzip, malformed records).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from control_plane.imports.formats import (
    PROVIDERS,
    BadRecord,
    Candidate,
    Deduper,
    Format,
    UnknownFormat,
    detect,
    tenants,
)
from control_plane.imports.formats import descope as descope_format
from control_plane.imports.formats import supabase as supabase_format
from control_plane.imports.formats.base import NAME_MAX

DATA = Path(__file__).resolve().parents[1] / "data" / "imports"
EXPECTED: dict[str, Any] = json.loads((DATA / "expected.json").read_text())["fixtures"]
FIXTURES = sorted(name for name in EXPECTED if (DATA / name).exists())
ALL_PROVIDERS = (*PROVIDERS, "descope")
SECRET_KEYS = {"password_hash", "custom_password_hash", "passwordHash", "salt", "encrypted_password",
               "password_digest", "password_hasher", "totp_secret"}


def provider_of(name: str) -> str:
    return str(EXPECTED[name]["provider"]).split()[0]  # "descope (multi-tenant importer)"


def run(fmt: Format, path: Path) -> tuple[list[str | None], list[tuple[str, str | None, str]], list[Candidate]]:
    """What an import run decides: created e-mails in order, skipped (id, email, reason)."""
    deduper = Deduper()
    created, skipped, seen = [], [], []
    for number, c in enumerate(fmt.records(path)):
        assert c.index == number
        seen.append(c)
        reason = deduper.reason(c)
        if reason is None:
            created.append(c.email)
        else:
            skipped.append((c.origin_id or f"#{c.index}", c.email, reason))
    return created, skipped, seen


def parse(provider: str, path: Path) -> list[Candidate]:
    return list(detect(provider, path).records(path))


def write(path: Path, text: str, *, bom: bool = False) -> Path:
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode())
    return path


def csv_text(rows: list[list[str]]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


# --- the fixtures -----------------------------------------------------------------------------

def test_every_committed_fixture_is_covered() -> None:
    assert "auth0/users-export-large.ndjson" not in FIXTURES  # generated, never committed
    assert len(FIXTURES) == len(EXPECTED) - 1 == 13


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_reproduces_expected(name: str) -> None:
    expected = EXPECTED[name]
    fmt = detect(provider_of(name), DATA / name)
    assert fmt.provider == provider_of(name)
    created, skipped, seen = run(fmt, DATA / name)

    assert len(seen) == expected["records"]
    assert created == expected["created_emails"]
    want = [(s["id"], s["email"], s["reason"]) for s in expected["skipped"]]
    assert sorted(skipped, key=repr) == sorted(want, key=repr)
    assert Counter(reason for *_, reason in skipped) == Counter(expected["skipped_by_reason"])
    first = expected["first_run"]
    assert (len(created), len(skipped)) == (first["created"], first["skipped"])
    assert first["errored"] == 0


@pytest.mark.parametrize(("name", "layout"), [
    ("auth0/users-export.ndjson", "NDJSON"), ("auth0/users-export.csv", "CSV"),
    ("auth0/users-import.json", "bulk-import"), ("firebase/auth-export.json", "JSON"),
    ("firebase/auth-export.csv", "52 columns"), ("firebase/auth-export-legacy.csv", "28 columns"),
    ("cognito/list-users.json", "list-users"), ("cognito/users.csv", "CSV"),
    ("supabase/auth_users.csv", "CSV"), ("supabase/auth_users.json", "json_agg"),
    ("clerk/users-export.csv", "Dashboard CSV"), ("clerk/users-backend-api.json", "Backend API"),
    ("descope/project-export.json", "tenants and users"),
])
def test_detect_names_the_layout(name: str, layout: str) -> None:
    assert layout in detect(provider_of(name), DATA / name).name


def test_descope_organizations_memberships_and_per_user_facts() -> None:
    path = DATA / "descope" / "project-export.json"
    expected = EXPECTED["descope/project-export.json"]
    orgs = tenants(path)
    domains = expected["organizations"]["self_provisioning_domains"]
    assert len(orgs) == expected["organizations"]["first_run"]["created"] == 5
    assert {t.name: list(t.self_provisioning_domains) for t in orgs} == domains
    names = {t.id: t.name for t in orgs}

    deduper = Deduper()
    by_user = {p["userId"]: p for p in expected["per_user"]}
    roles: Counter[str] = Counter()
    members: Counter[str] = Counter({name: 0 for name in domains})
    for c in detect("descope", path).records(path):
        reason = deduper.reason(c)
        facts = by_user.pop(str(c.origin_id))
        assert facts["email"] == c.email
        assert facts["outcome"] == ("created" if reason is None else f"skipped:{reason}")
        if reason is not None:
            continue  # a skipped user's memberships are dropped (A11)
        assert [(names[t], role) for t, role in c.memberships] == [
            (m["tenant"], m["role"]) for m in facts["memberships"]]
        assert c.metadata["custom"] == facts["metadata_custom"]
        assert list(c.oauth_providers) == facts["oauth_providers"]
        assert c.totp_enrolled is facts["totp_enrolled"]
        roles.update(role for _, role in c.memberships)
        members.update(names[t] for t, _ in c.memberships)
    assert by_user == {}
    assert sum(roles.values()) == expected["memberships"]["total"]
    assert dict(roles) == expected["memberships"]["by_role"]
    assert dict(members) == expected["organizations"]["members_per_org"]


@pytest.mark.parametrize(("origin", "mapped"), [
    ("admin", "admin"), ("tenant_admin", "admin"), ("Tenant Admin", "admin"), ("  TENANT-admin ", "admin"),
    ("owner", "owner"), ("super_admin", "owner"), ("Super Admin", "owner"),
    ("member", "member"), ("viewer", "member"), ("billing-manager", "member"), ("", "member"),
])
def test_descope_role_mapping(origin: str, mapped: str) -> None:
    assert descope_format.role_of(origin) == mapped


def test_descope_highest_role_wins_and_no_role_is_member() -> None:
    assert descope_format.highest(["viewer", "Tenant Admin"]) == "admin"
    assert descope_format.highest(["admin", "super_admin", "member"]) == "owner"
    assert descope_format.highest([]) == descope_format.highest(None) == "member"


def _secrets(value: Any, found: set[str]) -> None:
    """Every string under a password-material key of a JSON document."""
    if isinstance(value, dict):
        for key, inner in value.items():
            if key in SECRET_KEYS:
                found.update(s for s in _strings(inner) if len(s) >= 8)
            _secrets(inner, found)
    elif isinstance(value, list):
        for inner in value:
            _secrets(inner, found)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for inner in value.values():
            yield from _strings(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _strings(inner)


def fixture_secrets(name: str) -> set[str]:
    found: set[str] = set()
    text = (DATA / name).read_text()
    if name.endswith(".json"):
        _secrets(json.loads(text), found)
    elif name.endswith(".ndjson"):
        for line in text.splitlines():
            _secrets(json.loads(line), found)
    elif name.startswith("firebase/"):  # header-less: passwordHash and salt are columns 3 and 4
        found.update(c for row in csv.reader(io.StringIO(text)) for c in row[3:5] if len(c) >= 8)
    else:
        for row in csv.DictReader(io.StringIO(text)):
            found.update(v for k, v in row.items() if k in SECRET_KEYS and v and len(v) >= 8)
    return found


def _keys(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield key
            yield from _keys(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _keys(inner)


@pytest.mark.parametrize("name", FIXTURES)
def test_no_password_material_in_any_candidate(name: str) -> None:
    secrets = fixture_secrets(name)
    if name.startswith(("auth0/users-import", "firebase/", "supabase/", "clerk/users-export")):
        assert secrets, "the fixture carries password material to look for"
    for c in parse(provider_of(name), DATA / name):
        assert not SECRET_KEYS & set(_keys(c.metadata))
        blob = orjson.dumps(c.metadata).decode() + repr(c)
        assert [s for s in secrets if s in blob] == []


# --- detect refuses ---------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "provider"), [
    (name, provider) for name in FIXTURES for provider in ALL_PROVIDERS if provider != provider_of(name)])
def test_detect_refuses_another_providers_file(name: str, provider: str) -> None:
    with pytest.raises(UnknownFormat, match=f"not an? {provider} export: expected"):
        detect(provider, DATA / name)


def test_refusal_names_the_expected_formats() -> None:
    with pytest.raises(UnknownFormat) as refused:
        detect("auth0", DATA / "firebase" / "auth-export.json")
    assert str(refused.value) == ("not an auth0 export: expected an Auth0 bulk export (NDJSON or CSV) "
                                  "or a bulk-import JSON array")
    with pytest.raises(UnknownFormat, match="header-less CSV of 28 or 52 columns"):
        detect("firebase", DATA / "auth0" / "users-export.ndjson")


@pytest.mark.parametrize("content", [b"", b"  \n\n", b"\xef\xbb\xbf", gzip.compress(b"")], ids=[
    "empty", "blank", "bom-only", "empty-gzip"])
@pytest.mark.parametrize("provider", ALL_PROVIDERS)
def test_detect_refuses_an_empty_file(tmp_path: Path, provider: str, content: bytes) -> None:
    path = tmp_path / "users.json"
    path.write_bytes(content)
    with pytest.raises(UnknownFormat, match=r"export: expected .*\(the file is empty\)"):
        detect(provider, path)


@pytest.mark.parametrize("content", [
    b"Lorem ipsum dolor sit amet, consectetur adipiscing elit.\nSed do eiusmod tempor.\n",
    b"{this is not json at all\n", b"[1, 2, 3]", b'{"hello": "world"}\n', b"null",
    b"\x00\x01\x02\xff\xfe binary", b"\x1f\x8b\x08 broken gzip",
], ids=["prose", "brace-text", "numbers", "foreign-object", "null", "binary", "bad-gzip"])
@pytest.mark.parametrize("provider", ALL_PROVIDERS)
def test_detect_refuses_random_content(tmp_path: Path, provider: str, content: bytes) -> None:
    path = tmp_path / "export.csv"
    path.write_bytes(content)
    with pytest.raises(UnknownFormat, match="export: expected"):
        detect(provider, path)


def test_detect_refuses_a_provider_without_formats(tmp_path: Path) -> None:
    with pytest.raises(UnknownFormat, match="no import formats for provider 'okta': known are auth0"):
        detect("okta", DATA / "auth0" / "users-export.ndjson")


def test_detect_looks_at_the_content_never_the_name(tmp_path: Path) -> None:
    misnamed = tmp_path / "users.csv"
    misnamed.write_bytes((DATA / "firebase" / "auth-export.json").read_bytes())
    assert detect("firebase", misnamed).name == "firebase auth:export JSON"
    no_suffix = tmp_path / "download"
    no_suffix.write_bytes((DATA / "auth0" / "users-export.csv").read_bytes())
    assert detect("auth0", no_suffix).name == "auth0 bulk export (CSV)"


# --- found in the wild ------------------------------------------------------------------------

@pytest.mark.parametrize("name", FIXTURES)
def test_gzip_is_read_transparently(tmp_path: Path, name: str) -> None:
    path = tmp_path / "export.bin"  # Auth0 downloads are .csv.gz / .json.gz; the name is not used
    path.write_bytes(gzip.compress((DATA / name).read_bytes()))
    created, skipped, _ = run(detect(provider_of(name), path), path)
    assert created == EXPECTED[name]["created_emails"]
    assert len(skipped) == EXPECTED[name]["first_run"]["skipped"]


@pytest.mark.parametrize("name", FIXTURES)
def test_a_byte_order_mark_changes_nothing(tmp_path: Path, name: str) -> None:
    path = write(tmp_path / "export", (DATA / name).read_text(), bom=True)
    fmt = detect(provider_of(name), path)
    assert fmt.name == detect(provider_of(name), DATA / name).name
    created, _, seen = run(fmt, path)
    assert created == EXPECTED[name]["created_emails"]
    first = seen[0].origin_id or seen[0].email
    assert first and not first.startswith("\ufeff")


def test_auth0_csv_quoted_newline_stays_in_its_cell(tmp_path: Path) -> None:
    path = write(tmp_path / "export.csv", (
        "user_id,email,email_verified,name\n"
        "\"'auth0|1\",\"'a@example.com\",true,\"'Line one\nline two, with \"\"quotes\"\"\"\n"
        "\"'auth0|2\",\"'b@example.com\",true,\"'Bee\"\n"
        "\"'auth0|3\",\"'c@example.com\",true\n"))
    records = detect("auth0", path).records(path)
    first = next(records)
    assert (first.index, first.origin_id, first.name) == (0, "auth0|1", 'Line one\nline two, with "quotes"')
    assert next(records).index == 1
    with pytest.raises(ValueError, match=r"record 2 \(line 5\): 3 fields where the header has 4"):
        next(records)
    assert list(records) == []


def test_firebase_csv_quoted_newline_and_quotes(tmp_path: Path) -> None:
    row = ["uid1", "x@example.com", "true", "hash", "salt", 'Two\nlines "quoted", too'] + [""] * 46 + [""]
    path = write(tmp_path / "users.csv", csv_text([row, ["uid2", "y@example.com", "false", *[""] * 50]]))
    fmt = detect("firebase", path)
    assert fmt.name == "firebase auth:export CSV (52 columns)"
    first, second = fmt.records(path)
    assert (first.name, first.skip) == ('Two\nlines "quoted", too', None)
    assert (second.index, second.origin_id, second.skip) == (1, "uid2", "unverified")


def test_auth0_csv_extra_and_reordered_columns_and_dashboard_labels(tmp_path: Path) -> None:
    path = write(tmp_path / "export.csv", csv_text([
        ["Favourite Colour", "Blocked", "Email", "Name", "Email Verified", "Id", "Created At"],
        ["'blue", "", "'Ann@Example.com", "'Ann", "true", "'auth0|a", "2023-01-01T00:00:00.000Z"],
        ["'red", "true", "'bob@example.com", "'Bob", "true", "'auth0|b", "2023-01-01T00:00:00.000Z"],
    ]))
    ann, bob = parse("auth0", path)
    assert (ann.origin_id, ann.email, ann.name, ann.skip) == ("auth0|a", "Ann@Example.com", "Ann", None)
    assert (bob.origin_id, bob.skip) == ("auth0|b", "blocked")


def test_auth0_plain_csv_and_an_escaped_leading_quote(tmp_path: Path) -> None:
    plain = write(tmp_path / "plain.csv", "user_id,email,email_verified,name\nauth0|1,a@example.com,true,'Quoted\n")
    fmt = detect("auth0", plain)
    assert fmt.name == "auth0 CSV export (plain, no ' prefix)"
    assert [(c.origin_id, c.name) for c in fmt.records(plain)] == [("auth0|1", "'Quoted")]
    escaped = write(tmp_path / "escaped.csv",
                    "user_id,email,email_verified,name\n\"'auth0|1\",\"'a@example.com\",true,\"''Quoted\"\n")
    assert [(c.origin_id, c.name) for c in parse("auth0", escaped)] == [("auth0|1", "'Quoted")]


def test_supabase_csv_any_subset_of_columns_in_any_order(tmp_path: Path) -> None:
    path = write(tmp_path / "users.csv", csv_text([
        ["note", "email_confirmed_at", "deleted_at", "email", "banned_until", "id"],
        ["x", "2024-01-01 00:00:00+00", "", "a@example.com", "", "id-a"],
        ["y", "", "", "b@example.com", "", "id-b"],
    ]))
    assert [(c.origin_id, c.skip) for c in parse("supabase", path)] == [("id-a", None), ("id-b", "unverified")]


def test_cognito_csv_reordered_with_extra_columns(tmp_path: Path) -> None:
    path = write(tmp_path / "users.csv", csv_text([
        ["UserStatus", "custom:team", "email", "Enabled", "email_verified", "sub", "given_name", "family_name"],
        ["CONFIRMED", "red", "a@example.com", "True", "true", "sub-a", "Ann", "Lee"],
        ["UNCONFIRMED", "", "b@example.com", "True", "true", "sub-b", "", ""],
        ["CONFIRMED", "", "c@example.com", "False", "false", "sub-c", "", ""],
    ]))
    got = [(c.origin_id, c.name, c.skip) for c in parse("cognito", path)]
    assert got == [("sub-a", "Ann Lee", None), ("sub-b", "", "status"), ("sub-c", "", "disabled")]


def test_clerk_csv_reordered_with_extra_columns(tmp_path: Path) -> None:
    path = write(tmp_path / "users.csv", csv_text([
        ["verified_email_addresses", "notes", "primary_email_address", "id", "last_name", "first_name"],
        ["other@example.com|Ann@Example.com", "x", "ann@example.com", "user_a", "Lee", "Ann"],
        ["other@example.com", "", "bob@example.com", "user_b", "", "Bob"],
    ]))
    got = [(c.origin_id, c.name, c.skip) for c in parse("clerk", path)]
    assert got == [("user_a", "Ann Lee", None), ("user_b", "Bob", "unverified")]


def test_auth0_nulls_where_strings_are_expected(tmp_path: Path) -> None:
    lines = [
        {"user_id": "auth0|1", "email": None, "email_verified": True},
        {"user_id": "auth0|2", "email": "b@example.com", "email_verified": None, "name": None},
        {"user_id": "auth0|3", "email": "c@example.com", "email_verified": True, "blocked": None,
         "name": None, "given_name": "Cee", "family_name": None},
        {"user_id": None, "email": "  ", "email_verified": True},
    ]
    path = write(tmp_path / "export.json", "".join(json.dumps(line) + "\n" for line in lines))
    got = [(c.origin_id, c.email, c.name, c.skip) for c in parse("auth0", path)]
    assert got == [("auth0|1", None, "", "no_email"), ("auth0|2", "b@example.com", "", "unverified"),
                   ("auth0|3", "c@example.com", "Cee", None), (None, None, "", "no_email")]


def test_nulls_in_the_json_formats(tmp_path: Path) -> None:
    firebase = write(tmp_path / "f.json", json.dumps({"users": [
        {"localId": "f1", "email": "a@example.com", "emailVerified": True, "displayName": None, "disabled": None}]}))
    assert [(c.name, c.skip) for c in parse("firebase", firebase)] == [("", None)]
    cognito = write(tmp_path / "c.json", json.dumps({"Users": [
        {"Username": "u1", "Attributes": [{"Name": "email", "Value": "a@example.com"},
                                          {"Name": "email_verified", "Value": None}],
         "Enabled": None, "UserStatus": "CONFIRMED"},
        {"Username": "u2", "Attributes": None, "Enabled": True, "UserStatus": "CONFIRMED"}]}))
    assert [(c.origin_id, c.skip) for c in parse("cognito", cognito)] == [("u1", "unverified"), ("u2", "no_email")]
    supabase = write(tmp_path / "s.json", json.dumps([
        {"id": "s1", "email": None, "email_confirmed_at": None, "banned_until": None, "deleted_at": None},
        {"id": "s2", "email": "b@example.com", "email_confirmed_at": "2024-01-01T00:00:00+00:00",
         "raw_user_meta_data": None, "banned_until": None, "deleted_at": None}]))
    assert [(c.origin_id, c.skip) for c in parse("supabase", supabase)] == [("s1", "no_email"), ("s2", None)]
    clerk = write(tmp_path / "k.json", json.dumps([
        {"id": "user_1", "object": "user", "first_name": None, "last_name": "Solo", "primary_email_address_id": "e1",
         "email_addresses": [{"id": "e1", "email_address": "a@example.com", "verification": None}],
         "banned": None, "locked": None},
        {"id": "user_2", "object": "user", "primary_email_address_id": None, "email_addresses": None}]))
    got = [(c.origin_id, c.name, c.skip) for c in parse("clerk", clerk)]
    assert got == [("user_1", "Solo", "unverified"), ("user_2", "", "no_email")]
    descope = write(tmp_path / "d.json", json.dumps({"tenants": [], "users": [
        {"userId": "U1", "email": "a@example.com", "verifiedEmail": True, "status": "enabled", "name": None,
         "givenName": None, "familyName": None, "customAttributes": None, "OAuth": None, "TOTP": None,
         "userTenants": None, "roleNames": None}]}))
    (user,) = parse("descope", descope)
    assert (user.skip, user.name, user.memberships, user.oauth_providers, user.totp_enrolled) == (
        None, "", (), (), False)
    assert user.metadata == {"import": {"provider": "descope", "id": "U1", "oauth_providers": [],
                                        "totp_enrolled": False}, "custom": {}}


def test_mixed_case_emails_are_kept_and_deduplicated_case_insensitively(tmp_path: Path) -> None:
    lines = [
        {"user_id": "auth0|1", "email": "Ann.Lee@Example.COM", "email_verified": False},
        {"user_id": "auth0|2", "email": "ANN.LEE@EXAMPLE.COM", "email_verified": True},
        {"user_id": "auth0|3", "email": "ann.lee@example.com", "email_verified": True},
        {"user_id": "auth0|4", "email": " Bo@Example.com ", "email_verified": True},
    ]
    path = write(tmp_path / "export.json", "".join(json.dumps(line) + "\n" for line in lines))
    created, skipped, _ = run(detect("auth0", path), path)
    assert created == ["ANN.LEE@EXAMPLE.COM", "Bo@Example.com"]  # the first *eligible* one wins (A1)
    assert skipped == [("auth0|1", "Ann.Lee@Example.COM", "unverified"),
                       ("auth0|3", "ann.lee@example.com", "duplicate")]


def test_deduper_passes_skips_through_and_remembers_only_created() -> None:
    def c(email: str | None, skip: str | None = None) -> Candidate:
        return Candidate(index=0, origin_id=None, email=email, name="", skip=skip, metadata={})
    deduper = Deduper()
    assert deduper.reason(c("a@example.com", "unverified")) == "unverified"
    assert deduper.reason(c("A@example.com")) is None
    assert deduper.reason(c("a@EXAMPLE.com")) == "duplicate"
    assert deduper.reason(c("a@example.com", "blocked")) == "blocked"
    assert deduper.reason(c(None, "no_email")) == "no_email"


def test_names_are_at_most_200_characters(tmp_path: Path) -> None:
    path = write(tmp_path / "export.json", json.dumps({"user_id": "auth0|1", "name": "x" * 500}) + "\n")
    assert parse("auth0", path)[0].name == "x" * NAME_MAX


def test_metadata_says_where_the_user_came_from(tmp_path: Path) -> None:
    (first,) = parse("auth0", write(tmp_path / "e.json", '{"user_id":"auth0|9","email":"a@example.com"}\n'))
    assert first.metadata == {"import": {"provider": "auth0", "id": "auth0|9"}}


# --- skip rules at their edges ----------------------------------------------------------------

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(("banned_until", "deleted_at", "skip"), [
    (None, None, None),
    ("2026-11-21 12:00:00+00", None, None),  # a ban ending exactly now is over (GoTrue now.Before)
    ("2026-11-21 12:00:01+00", None, "banned"),
    ("2026-11-21 13:00:00+01", None, None),
    ("2025-03-01 12:00:00+00", None, None),
    ("infinity", None, "banned"),
    ("12026-01-01 00:00:00+00", None, "banned"),
    (None, "2024-08-02 06:38:26.658+00", "deleted"),
    ("2999-01-01 00:00:00+00", "2024-08-02 06:38:26.658+00", "deleted"),
])
def test_supabase_bans_are_compared_with_now(tmp_path: Path, banned_until: str | None, deleted_at: str | None,
                                              skip: str | None) -> None:
    header = ["id", "email", "email_confirmed_at", "banned_until", "deleted_at"]
    row = ["id-1", "a@example.com", "2024-01-01 00:00:00+00", banned_until or "", deleted_at or ""]
    path = write(tmp_path / "users.csv", csv_text([header, row]))
    (got,) = supabase_format.read_csv(path, now=NOW)
    assert isinstance(got, Candidate) and got.skip == skip
    doc = write(tmp_path / "users.json", json.dumps([dict(zip(header, [
        v.replace(" ", "T", 1) if v and v[0].isdigit() and k != "id" else (v or None)
        for k, v in zip(header, row, strict=True)], strict=True))]))
    (got,) = supabase_format.read_json(doc, now=NOW)
    assert isinstance(got, Candidate) and got.skip == skip


def test_supabase_records_use_the_current_time(tmp_path: Path) -> None:
    soon = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    path = write(tmp_path / "u.json", json.dumps([
        {"id": "1", "email": "a@example.com", "email_confirmed_at": soon, "banned_until": soon}]))
    assert [c.skip for c in parse("supabase", path)] == ["banned"]


@pytest.mark.parametrize(("status", "enabled", "verified", "skip"), [
    ("CONFIRMED", True, "true", None), ("EXTERNAL_PROVIDER", True, "true", None),
    ("UNCONFIRMED", True, "true", "status"), ("FORCE_CHANGE_PASSWORD", True, "true", "status"),
    ("RESET_REQUIRED", True, "true", "status"), ("ARCHIVED", True, "true", "status"),
    ("COMPROMISED", True, "true", "status"), ("UNKNOWN", True, "true", "status"),
    ("UNCONFIRMED", False, "false", "disabled"),  # A4: disabled > status > unverified
    ("UNCONFIRMED", True, "false", "status"), ("EXTERNAL_PROVIDER", True, "false", "unverified"),
    ("EXTERNAL_PROVIDER", True, None, "unverified"),  # A3: strict
])
def test_cognito_status_rule_and_precedence(tmp_path: Path, status: str, enabled: bool, verified: str | None,
                                            skip: str | None) -> None:
    attributes = [{"Name": "email", "Value": "a@example.com"}]
    if verified is not None:
        attributes.append({"Name": "email_verified", "Value": verified})
    path = write(tmp_path / "users.json", json.dumps({"Users": [
        {"Username": "u", "Attributes": attributes, "Enabled": enabled, "UserStatus": status,
         "UserCreateDate": "2023-05-01T15:43:49.578000+00:00"}]}))  # AWS CLI v2 prints ISO-8601
    assert [c.skip for c in parse("cognito", path)] == [skip]


@pytest.mark.parametrize(("status", "verified", "skip"), [
    ("enabled", True, None), ("disabled", True, "disabled"), ("disabled", False, "disabled"),
    ("invited", True, "status"), ("invited", False, "unverified"), ("expired", True, "status"),
])
def test_descope_status(tmp_path: Path, status: str, verified: bool, skip: str | None) -> None:
    path = write(tmp_path / "d.json", json.dumps({"tenants": [], "users": [
        {"userId": "U1", "email": "a@example.com", "verifiedEmail": verified, "status": status}]}))
    assert [c.skip for c in parse("descope", path)] == [skip]


# --- records that cannot be understood --------------------------------------------------------

def test_a_line_that_is_not_json_is_an_error_and_the_rest_is_read(tmp_path: Path) -> None:
    path = write(tmp_path / "export.json", (
        '{"user_id":"auth0|1","email":"a@example.com","email_verified":true}\n'
        "\n"
        "{not json\n"
        '["an", "array"]\n'
        '{"user_id":"auth0|4","email":"d@example.com","email_verified":true}\n'))
    records = detect("auth0", path).records(path)
    assert next(records).index == 0
    with pytest.raises(ValueError, match=r"record 1 \(line 3\): not JSON") as bad:
        next(records)
    assert isinstance(bad.value, BadRecord) and bad.value.index == 1
    with pytest.raises(ValueError, match=r"record 2 \(line 4\): not a JSON object"):
        next(records)
    last = next(records)
    assert (last.index, last.origin_id) == (3, "auth0|4")
    assert list(records) == []


def test_a_firebase_row_of_the_wrong_width_is_an_error(tmp_path: Path) -> None:
    good = ["uid1", "a@example.com", "true", *[""] * 25, ""]
    path = write(tmp_path / "users.csv", csv_text([good, ["uid2", "b@example.com", "true", "x"], good]))
    records = detect("firebase", path).records(path)
    assert next(records).index == 0
    with pytest.raises(ValueError, match=r"record 1 \(line 2\): 4 fields where this export has 28 columns"):
        next(records)
    assert next(records).index == 2


def test_an_array_element_that_is_not_an_object_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path / "import.json", json.dumps([{"email": "a@example.com"}, "oops", {"email": "c@example.com"}]))
    records = detect("auth0", path).records(path)
    assert next(records).skip == "unverified"
    with pytest.raises(ValueError, match=r"record 1 \(element 2\): not a JSON object"):
        next(records)
    assert next(records).index == 2


def test_an_email_that_is_not_a_string_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path / "export.json", '{"user_id":"auth0|1","email":42}\n')
    with pytest.raises(ValueError, match=r"record 0 \(line 1\): the email is not a string"):
        parse("auth0", path)


# --- streaming --------------------------------------------------------------------------------

def test_ndjson_is_streamed_with_flat_memory(tmp_path: Path) -> None:
    path = tmp_path / "large.ndjson"
    with path.open("w") as out:
        for i in range(20_000):
            out.write(json.dumps({"user_id": f"auth0|{i:024x}", "email": f"user{i}@example.com",
                                  "email_verified": True, "name": "x" * 400}) + "\n")
    size = path.stat().st_size
    fmt = detect("auth0", path)
    tracemalloc.start()
    try:
        count = sum(1 for _ in fmt.records(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 20_000
    assert peak < size / 5, (peak, size)
