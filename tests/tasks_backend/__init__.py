"""Tests of the django.tasks backend (Django >= 6.0; the import test runs everywhere)."""
