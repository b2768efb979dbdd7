"""``authio login``, ``authio import`` and ``authio logout`` run as a user runs them, against the
suite's service: every fixture reproduces its expected tally, a second run finds every user,
a dry run sends nothing, a killed run resumes to the same users, a changed file is refused."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.fixtures.database import events
from tests.fixtures.service import Api, Project, bootstrap_project
from tests.imports.helpers import (
    AUTHIO,
    DATA,
    as_project,
    authio,
    cli_env,
    cursor_of,
    kill_after_progress,
    text_and_mode,
    users_of,
)

EXPECTED: dict[str, Any] = json.loads((DATA / "expected.json").read_text())["fixtures"]
STANDARD = sorted(name for name, f in EXPECTED.items()
                  if not name.startswith("descope/") and (DATA / name).exists())
PASSWORD_MATERIAL = re.compile(r"\$2[aby]\$|password|salt|totp", re.IGNORECASE)


def _line(tally: dict[str, int]) -> str:
    return (f"created {tally['created']}, existed {tally['existed']}, skipped {tally['skipped']}, "
            f"errored {tally['errored']}")


@pytest.mark.parametrize("name", STANDARD)
async def test_every_export_imports_to_its_expected_tally(name: str, service: Api,
                                                          tmp_path: Path) -> None:
    expected = EXPECTED[name]
    project = await bootstrap_project(service, "import")
    file = tmp_path / Path(name).name
    shutil.copy(DATA / name, file)
    env = as_project(project, tmp_path / "config")
    first = await authio("import", expected["provider"], "--file", str(file),
                         "--rate-limit-rps", "1000", env=env)
    assert first.code == 0, first.err
    assert first.last_line == _line(expected["first_run"])
    reasons = ", ".join(f"{r} {n}" for r, n in sorted(expected["skipped_by_reason"].items()))
    assert f"skipped {expected['first_run']['skipped']}: {reasons}" in first.out
    assert "POST /v1/organizations" in first.out  # rule 5: what is not imported, and how
    assert cursor_of(file) is None  # done: the next run starts over

    users = await users_of(project.api)
    assert sorted(u["email"].lower() for u in users) == sorted(
        e.lower() for e in expected["created_emails"])
    for user in users:
        assert user["email_verified"] is True
        assert user["metadata"]["import"]["provider"] == expected["provider"]
        assert not PASSWORD_MATERIAL.search(json.dumps(user["metadata"])), user

    second = await authio("import", expected["provider"], "--file", str(file),
                          "--rate-limit-rps", "1000", env=env)
    assert second.code == 0, second.err
    assert second.last_line == _line(expected["second_run"])


async def test_a_dry_run_sends_nothing(project: Project, tmp_path: Path) -> None:
    name = "auth0/users-export.ndjson"
    file = tmp_path / "export.ndjson"
    shutil.copy(DATA / name, file)
    # No key at all: a dry run never needs one.
    ran = await authio("import", "auth0", "--file", str(file), "--dry-run",
                       env=cli_env(tmp_path / "config"))
    assert ran.code == 0, ran.err
    assert ran.last_line == _line(EXPECTED[name]["first_run"])
    assert "dry run" in ran.err
    assert await users_of(project.api) == []
    assert cursor_of(file) is None


async def test_a_killed_import_resumes_to_every_user_once(project: Project, tmp_path: Path,
                                                          db: asyncpg.Pool) -> None:
    """Killed (SIGKILL) twice mid-way, then run to the end: each user of the file exists once,
    was created once, and the last tally covers the whole file."""
    name = "supabase/auth_users.csv"
    expected = EXPECTED[name]
    file = tmp_path / "auth_users.csv"
    shutil.copy(DATA / name, file)
    env = as_project(project, tmp_path / "config")
    reached = 0
    for _ in range(2):  # killed as soon as it has saved progress beyond the last run's
        reached = await kill_after_progress("import", "supabase", "--file", str(file),
                                            "--rate-limit-rps", "4", env=env, file=file,
                                            beyond=reached)
    saved = cursor_of(file)
    assert saved is not None and 0 < saved["next_index"] < expected["records"]
    done = await authio("import", "supabase", "--file", str(file), "--rate-limit-rps", "1000",
                        env=env)
    assert done.code == 0, done.err
    tally = dict(re.findall(r"(\w+) (\d+)", done.last_line))
    first = expected["first_run"]
    assert int(tally["created"]) + int(tally["existed"]) == first["created"]
    assert int(tally["skipped"]) == first["skipped"] and int(tally["errored"]) == 0
    users = await users_of(project.api)
    assert sorted(u["email"].lower() for u in users) == sorted(
        e.lower() for e in expected["created_emails"])
    assert len(await events(db, project.id, "user.created")) == first["created"]
    assert cursor_of(file) is None


async def test_a_changed_file_is_refused_unless_forced(project: Project, tmp_path: Path) -> None:
    file = tmp_path / "export.ndjson"
    shutil.copy(DATA / "auth0/users-export.ndjson", file)
    env = as_project(project, tmp_path / "config")
    await kill_after_progress("import", "auth0", "--file", str(file), "--rate-limit-rps", "4",
                              env=env, file=file)
    with file.open("a") as f:
        f.write('{"user_id": "auth0|added", "email": "added@example.com", '
                '"email_verified": true}\n')
    refused = await authio("import", "auth0", "--file", str(file), env=env)
    assert refused.code == 2
    assert "changed" in refused.err and "--force" in refused.err
    forced = await authio("import", "auth0", "--file", str(file), "--force",
                          "--rate-limit-rps", "1000", env=env)
    assert forced.code == 0, forced.err
    emails = {u["email"] for u in await users_of(project.api)}
    assert "added@example.com" in emails and len(emails) == 37


async def test_a_file_in_no_known_format_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "users.json"
    shutil.copy(DATA / "firebase/auth-export.json", file)
    ran = await authio("import", "auth0", "--file", str(file), "--dry-run",
                       env=cli_env(tmp_path / "config"))
    assert ran.code == 2 and "auth0" in ran.err, ran.err
    usage = await authio("import", "okta", "--file", str(file), env=cli_env(tmp_path / "c"))
    assert usage.code == 2


async def test_login_import_logout(project: Project, tmp_path: Path) -> None:
    """The whole flow as an operator lives it: login prints a code, the operator approves it,
    the key lands in the credentials file (0600), import uses it, logout revokes it."""
    config = tmp_path / "config"
    env = cli_env(config)
    proc = await asyncio.create_subprocess_exec(
        AUTHIO, "login", "--base-url", project.api.base_url, "--profile", "staging", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    printed = ""
    while "enter the code" not in printed:
        printed += (await asyncio.wait_for(proc.stdout.readline(), 15)).decode()
    user_code = re.search(r"enter the code ([A-Z]{4}-[A-Z]{4})", printed)
    assert user_code is not None, printed
    approved = await project.api.post("/v1/cli/device/approve", {"user_code": user_code[1]})
    assert approved.status == 200, approved.body
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err
    credentials = config / "authio" / "credentials"
    text, mode = text_and_mode(credentials)
    assert mode == 0o600
    assert "[staging]" in text and f"project_id = {project.id}" in text

    file = tmp_path / "export.csv"
    shutil.copy(DATA / "clerk/users-export.csv", file)
    missing = await authio("import", "clerk", "--file", str(file), env=env)
    assert missing.code == 2 and "authio login" in missing.err  # the default profile is empty
    ran = await authio("import", "clerk", "--file", str(file), "--profile", "staging",
                       "--rate-limit-rps", "1000", env=env)
    assert ran.code == 0, ran.err
    assert ran.last_line == _line(EXPECTED["clerk/users-export.csv"]["first_run"])

    key = re.search(r"api_key = (\S+)", text)
    assert key is not None
    out_ = await authio("logout", "--profile", "staging", env=env)
    assert out_.code == 0 and "revoked" in out_.out, out_
    assert "[staging]" not in text_and_mode(credentials)[0]
    assert (await project.api.with_key(key[1]).get("/v1/users")).status == 401


async def _members(api: Api) -> dict[str, dict[str, str]]:
    """Organization name -> {user e-mail (lower case): role}."""
    emails = {u["id"]: u["email"].lower() for u in await users_of(api)}
    out: dict[str, dict[str, str]] = {}
    r = await api.get("/v1/organizations?limit=100")
    for org in r.body["data"]:
        page = await api.get(f"/v1/organizations/{org['id']}/memberships?limit=100")
        out[org["name"]] = {emails[m["user_id"]]: m["role"] for m in page.body["data"]}
    return out


async def test_the_multi_tenant_importer(service: Api, tmp_path: Path) -> None:
    """Descope: tenants become organizations one to one (self-provisioning domains kept),
    tenant roles memberships (rule 6's mapping), custom attributes ``metadata.custom``, the
    OAuth providers and TOTP flag kept; a second run finds everything."""
    name = "descope/project-export.json"
    expected = EXPECTED[name]
    project = await bootstrap_project(service, "tenants")
    file = tmp_path / "export.json"
    shutil.copy(DATA / name, file)
    env = as_project(project, tmp_path / "config")
    first = await authio("import", "descope", "--input", str(file), "--rate-limit-rps", "1000",
                         env=env)
    assert first.code == 0, first.err
    assert first.last_line == _line(expected["first_run"])
    roles = expected["memberships"]["by_role"]
    assert "organizations: created 5, existed 0" in first.out
    assert (f"memberships: created {expected['memberships']['total']} (admin {roles['admin']}, "
            f"member {roles['member']}, owner {roles['owner']}), existed 0, errored 0") in first.out

    orgs = {o["name"]: o for o in (await project.api.get("/v1/organizations?limit=100")).body["data"]}
    assert {n: o["metadata"]["self_provisioning_domains"] for n, o in orgs.items()} == \
        expected["organizations"]["self_provisioning_domains"]
    members = await _members(project.api)
    assert {n: len(m) for n, m in members.items()} == expected["organizations"]["members_per_org"]
    users = {u["email"].lower(): u for u in await users_of(project.api)}
    for person in expected["per_user"]:
        if person["outcome"] != "created":
            continue
        user = users[person["email"].lower()]
        assert user["metadata"]["custom"] == person["metadata_custom"]
        assert user["metadata"]["import"]["oauth_providers"] == person["oauth_providers"]
        assert user["metadata"]["import"]["totp_enrolled"] == person["totp_enrolled"]
        assert {m["tenant"]: m["role"] for m in person["memberships"]} == {
            org: roles_[person["email"].lower()] for org, roles_ in members.items()
            if person["email"].lower() in roles_}

    second = await authio("import", "descope", "--input", str(file), "--rate-limit-rps", "1000",
                          env=env)
    assert second.code == 0, second.err
    assert second.last_line == _line(expected["second_run"])
    assert "organizations: created 0, existed 5" in second.out
    assert f"memberships: created 0, existed {expected['memberships']['total']}" in second.out
