"""Test-suite settings: property tests run with a fixed seed so CI runs repeat exactly."""

from hypothesis import settings

settings.register_profile("repeatable", derandomize=True, print_blob=True)
settings.load_profile("repeatable")
