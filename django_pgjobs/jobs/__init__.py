"""Jobs as the package knows them: defined (``definition``, ``keys``), registered
(``registry``), put in the table (``enqueue``), operated from code (``managers``, the
``Job.objects`` manager; ``operations``, retry and cancel of a selection) and known to
a running job (``context``).

The ``@job`` decorator that users meet is ``django_pgjobs/decorators.py``: it sits above
the workflows (``.s()``), which enqueue through this package.

At start-up the app imports every installed app's ``jobs`` module, this package
among them: it defines no job and imports nothing, so that costs nothing.
"""
