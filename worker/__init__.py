"""The Celery application: ``celery -A worker worker`` starts a skill worker."""
