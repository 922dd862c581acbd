"""Throwaway Django project for the django_pgjobs benchmark adapter."""
