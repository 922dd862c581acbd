from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "dj_pgjobs"
    label = "dj_pgjobs"
