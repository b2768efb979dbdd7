"""Mint one access token for the forward-auth benchmark (``bench_ceiling.sh``).

    python bench/edge_token.py --project-id proj_... [--ttl 3600]

Signs with the project's active key exactly as a sign-in would (``TokenService.issue``, the
keyring creating the project's first key when it has none), for a made-up user and session: the
engine's edge validation checks the signature, the claims and the revocation set, never that the
session row exists. Settings come from the environment as for ``authio serve`` (``DATABASE_URL``,
``SERVICE_KMS_KEY``/``SERVICE_KMS_KEY_FILE``, ``SERVICE_PUBLIC_BASE_URL``: the engine verifies
``iss`` against its own, so run both with the same). The token lives ``--ttl`` seconds (default
an hour, the most a bench run needs). Prints the token on standard output.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from common.db import create_pool
from common.ids import new_id
from common.settings import Settings
from control_plane.app import load_kms
from control_plane.sessions.tokens import TokenService
from control_plane.signing_keys.service import Keyring


async def mint(project_id: str) -> str:
    settings = Settings()
    pool = await create_pool(settings.database_url, max_size=2)
    try:
        tokens = TokenService(Keyring(pool, load_kms(settings)), settings)
        return await tokens.issue(project_id=project_id, user_id=new_id("user"),
                                  session_id=new_id("sess"), org_id=None, role=None,
                                  iat=int(time.time()))
    finally:
        await pool.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--project-id", required=True)
    ap.add_argument("--ttl", type=int, default=3600, help="seconds the token lives")
    args = ap.parse_args()
    os.environ["SERVICE_ACCESS_TOKEN_TTL_SECONDS"] = str(args.ttl)
    print(asyncio.run(mint(args.project_id)))


if __name__ == "__main__":
    main()
