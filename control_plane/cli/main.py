"""The ``authio`` command: serve, migrate, and the files a deployment needs.

    authio serve                  both apps on one port (PORT, default 8080)
    authio serve engine [--workers N]
                                  the engine alone (SERVICE_ENGINE_PORT, default 8081), N
                                  processes on that port (default: SERVICE_ENGINE_WORKERS,
                                  else one per core)
    authio serve control-plane    the control plane alone (PORT)
    authio migrate                apply pending schema migrations
    authio kms-key --file PATH    write a new key-encryption key to PATH unless it exists
    authio openapi [--out PATH]   write the OpenAPI document of every route (default: stdout)
    authio login [--profile P] [--base-url URL]
                                  sign this tool in (device code): saves a project's key
    authio logout [--profile P]   revoke that key and forget it
    authio import PROVIDER --file PATH [--dry-run] [--rate-limit-rps N] [--profile P] [--force]
                                  create users from an auth0, firebase, cognito, supabase or
                                  clerk export (docs/imports.md)
    authio import descope (--input PATH | --live-token T --source-project-id P) [...]
                                  the same, with tenants as organizations and roles as
                                  memberships

Logs are JSON lines on standard error (common.logging); traces follow the OTEL_* variables
(common.telemetry; spans on standard output by default).
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import sys

from common.logging import configure_logging
from common.settings import SettingsError, load_settings


def _write_kms_key(path: str) -> int:
    """Create ``path`` holding base64 of 32 random bytes, readable by its owner only; keep an
    existing file (it wraps every signing key already stored). Returns the exit code."""
    import base64

    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        print(f"{path} exists; kept", flush=True)
        return 0
    with os.fdopen(fd, "w") as f:
        f.write(base64.b64encode(secrets.token_bytes(32)).decode() + "\n")
    print(f"wrote a new key-encryption key to {path}", flush=True)
    return 0


def _write_openapi(out: str | None) -> int:
    """Write the OpenAPI document of every route, the development mailbox's included (what a
    local run serves at ``GET /openapi.json``; ``docs/openapi.json`` is this). Returns the exit
    code."""
    from control_plane.app import openapi_document

    document = openapi_document(dev_mailbox=True)
    if out is None:
        sys.stdout.buffer.write(document)
    else:
        with open(out, "wb") as f:
            f.write(document)
    return 0


PROVIDERS = ("auth0", "clerk", "cognito", "descope", "firebase", "supabase")
"""What ``authio import`` takes: ``control_plane.imports.formats.PROVIDERS`` (``--file``) and the
multi-tenant ``descope`` (``--input``); not imported here, so ``authio serve`` starts without the
parsers."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="authio", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the service")
    serve.add_argument("target", nargs="?", default="all",
                       choices=["all", "engine", "control-plane"])
    serve.add_argument("--workers", type=int, metavar="N",
                       help="engine only: N engine processes sharing the port (SO_REUSEPORT) "
                            "under a supervisor (default: SERVICE_ENGINE_WORKERS, else one per "
                            "core; 1: a single process)")
    serve.add_argument("--generate-bootstrap-token", action="store_true",
                       help="when SERVICE_BOOTSTRAP_TOKEN is unset, make one for this run and "
                            "print it once (local development)")
    sub.add_parser("migrate", help="apply pending schema migrations")
    kms_key = sub.add_parser("kms-key", help="write a new key-encryption key (SERVICE_KMS_KEY_FILE) "
                                             "to a file, unless the file exists")
    kms_key.add_argument("--file", required=True, help="path of the key file (created mode 0600)")
    openapi = sub.add_parser("openapi", help="write the OpenAPI 3.1 document of every route")
    openapi.add_argument("--out", help="file to write (default: standard output)")
    login = sub.add_parser("login", help="sign this tool in to a project (device code, RFC 8628)")
    login.add_argument("--profile", help="credentials profile to save (default: default)")
    login.add_argument("--base-url", help="the control plane's URL (default: AUTHIO_BASE_URL, "
                                          "else http://localhost:8080)")
    login.add_argument("--no-browser", action="store_true", help="only print the URL and code")
    logout = sub.add_parser("logout", help="revoke the profile's key and remove the profile")
    logout.add_argument("--profile", help="credentials profile (default: default)")
    importing = sub.add_parser("import", help="create users from another provider's export")
    importing.add_argument("provider", choices=PROVIDERS,
                           help="where the export comes from")
    source = importing.add_mutually_exclusive_group()
    source.add_argument("--file", help="the export file (any of the provider's formats; .gz too)")
    source.add_argument("--input", help="the multi-tenant export (descope: its tenants and users)")
    importing.add_argument("--live-token", help="descope live mode: the origin project's "
                                                "management key (read once by the service, "
                                                "sealed, deleted within 24 hours)")
    importing.add_argument("--source-project-id", help="descope live mode: the origin project")
    importing.add_argument("--dry-run", action="store_true",
                           help="parse and count without sending anything")
    importing.add_argument("--rate-limit-rps", type=float, default=50.0,
                           help="most requests per second (default: 50)")
    importing.add_argument("--profile", help="credentials profile (default: default)")
    importing.add_argument("--force", action="store_true",
                           help="resume although the file changed since the last run")
    args = parser.parse_args(argv)
    if args.command == "serve" and args.workers is not None:
        if args.target != "engine":
            serve.error("--workers goes with `authio serve engine` only")
        if args.workers < 1:
            serve.error(f"--workers must be 1 or more, not {args.workers}")
    if args.command == "login":
        from control_plane.cli.login import login as sign_in

        sys.exit(sign_in(args.profile, args.base_url, open_browser=not args.no_browser))
    if args.command == "logout":
        from control_plane.cli.login import logout as sign_out

        sys.exit(sign_out(args.profile))
    if args.command == "import":
        from control_plane.cli.import_users import import_users

        live = (args.source_project_id, args.live_token) \
            if args.live_token or args.source_project_id else None
        if args.provider == "descope":
            if live is not None and not all(live):
                importing.error("live mode takes both --live-token and --source-project-id")
            if (live is None) == (args.input is None):
                importing.error("descope takes --input, or --live-token and --source-project-id")
            given = args.input
        else:
            if live is not None or args.input is not None:
                importing.error(f"{args.provider} takes --file (live mode and --input are the "
                                "multi-tenant importer's: descope)")
            if args.file is None:
                importing.error(f"{args.provider} takes --file")
            given = args.file
        sys.exit(import_users(args.provider, given, dry_run=args.dry_run,
                              rate=args.rate_limit_rps, profile=args.profile, force=args.force,
                              live=live))
    if args.command == "kms-key":
        sys.exit(_write_kms_key(args.file))
    if args.command == "openapi":
        sys.exit(_write_openapi(args.out))

    if getattr(args, "generate_bootstrap_token", False) and not os.environ.get(
        "SERVICE_BOOTSTRAP_TOKEN"
    ):
        token = secrets.token_urlsafe(32)
        os.environ["SERVICE_BOOTSTRAP_TOKEN"] = token
        print(f"SERVICE_BOOTSTRAP_TOKEN for this run (shown once): {token}", flush=True)
    try:
        settings = load_settings()
    except SettingsError as exc:
        sys.exit(f"authio: {exc}")
    configure_logging(settings.log_level)  # JSON lines on stderr, with request and trace ids
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)  # one line per plugin
    if args.command == "migrate":
        from control_plane.migrate import upgrade

        upgrade(settings.database_url)
        print("migrations applied", flush=True)
    else:
        if args.target != "engine":  # the control plane needs its KMS key: fail before serving
            from control_plane.app import load_kms

            try:
                load_kms(settings)
            except SettingsError as exc:
                sys.exit(f"authio: {exc}")
        from control_plane.cli.serve import serve as run_service

        run_service(settings, args.target, args.workers)


if __name__ == "__main__":
    main()
