"""Support for the serving-engine tests (tests/test_engine_*.py): engine install, stubs, ranks."""
