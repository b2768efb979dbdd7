"""What every domain's endpoints share and no domain owns: the acting party and how it is
authenticated (``actor``, ``auth``), the typed endpoint decorator (``endpoint``), keyset
pagination with signed cursors, the project of a public endpoint, rate limits, and HTML pages.

Nothing here imports a domain package: domains build on ``web``, never the other way round.
"""
