"""Locust entry point: only imports the scenarios from bench/scenarios/.

    AUTHIO_API_KEY=... AUTHIO_DATASET=bench/data/medium \
        locust -f bench/locustfile.py --headless -u 10 -r 10 -t 30s --host http://127.0.0.1:8080

Pick one scenario by naming its class, e.g. ``... -f bench/locustfile.py SingleCheckUser``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scenarios.checks import BatchCheckUser, SingleCheckUser

__all__ = ["BatchCheckUser", "SingleCheckUser"]
