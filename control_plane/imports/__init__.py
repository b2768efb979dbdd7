"""The import tool's server side and its pure parts: formats/ (one parser per origin provider),
the run, cursor files, and the device authorization grant of `authio login` (DESIGN.md "CLI login
and import", SPEC.md 4 "Import tool")."""
