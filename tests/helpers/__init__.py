"""What more than one test module uses, in one place: row builders, clusters, docs
parsers, metrics scrapers and the like. A test module imports from here (or from
``tests.conftest``), never from another test module: importing one couples the two
and brings the other's fixtures along (``tests/unit/test_test_imports.py`` checks)."""
