"""Alembic environment: epilab runs migrations on a connection it opened itself
(``TuningDB.open``), inside that connection's transaction."""

from alembic import context

from epilab.db.models import Base
from epilab.db.schema import VERSION_TABLE

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    version_table=VERSION_TABLE,
    render_as_batch=True,
)
with context.begin_transaction():
    context.run_migrations()
