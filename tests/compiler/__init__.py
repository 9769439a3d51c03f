"""Tests of compiler/."""
