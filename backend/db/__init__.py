"""Persistence of the Conductor: typed SQLAlchemy models, Alembic-migrated, plain-record API.

Callers use the keyword-only functions of `request_log`, `cluster_log` and `config_store`
with a Session from `session.create_session_factory`; they get back the frozen dataclasses
of `records`, never ORM rows (`convert` is the only module that maps between the two).
"""
