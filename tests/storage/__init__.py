"""Tests of runtime/storage/: local disk and gs:// (an emulated bucket), retries, faults."""
