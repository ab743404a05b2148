"""Durable state in SQL (SQLAlchemy Core + Alembic): tenants, apps, keys, usage, audit.

SQLite in the data dir by default (WAL); PostgreSQL when ``storage.database_url`` names one.
SQLAlchemy exceptions are translated to :class:`StoreError` here and never leave the package.
"""
