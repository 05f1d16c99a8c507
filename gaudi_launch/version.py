"""gaudi-launch's version, in one place: pyproject reads it, the package exports it, and any layer may say it
(the pre-flight's fix text names the launcher's version to install on a host). Imports nothing."""

__version__ = "0.1.0"
