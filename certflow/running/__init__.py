"""Running a worker: its settings (``worker_settings``), logs, tracing and the
schedules it installs."""
