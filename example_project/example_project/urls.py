"""The shop at ``/``, Django's admin (with the jobs admin) at ``/admin/``."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("shop.urls")),
]
