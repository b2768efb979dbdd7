"""Locust scenarios for authio; ``bench/locustfile.py`` imports the user classes from here.

Configuration comes from environment variables (see ``scenarios.checks``):
``AUTHIO_API_KEY``, ``AUTHIO_DATASET`` (default ``bench/data/medium``), and optionally
``AUTHIO_STORE_ID``, ``AUTHIO_BATCH_SIZE``, ``AUTHIO_VERIFY``, ``AUTHIO_THINK_TIME``.
"""
