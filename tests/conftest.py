"""Test set-up: interpreter mode for CPU runs, compiled mode for `pytest -m gpu`.

Triton picks interpreter or compiler when it is first imported, so the choice is
made here, before any test module imports epilab: a run selecting the ``gpu``
marker compiles for CUDA; every other run interprets kernels on CPU tensors.
Rendered kernels go to a per-session cache dir, never the user's.
"""

from __future__ import annotations

import functools
import os
import tempfile

import pytest

# the files whose cases take the longest on CPU (the interpreter's model zoo, whole-model tuning,
# the tuner's searches): `pytest --durations=40` names them
SLOW_FILES = ("test_zoo.py", "test_model_tuning.py", "test_tuner.py")


def _gpu_run(config: pytest.Config) -> bool:
    expr = (config.getoption("markexpr") or "").replace(" ", "")
    return "gpu" in expr and "notgpu" not in expr


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("EPILAB_CACHE_DIR", tempfile.mkdtemp(prefix="epilab-test-cache-"))
    if not _gpu_run(config):
        os.environ["EPILAB_INTERPRET"] = "1"
        os.environ["TRITON_INTERPRET"] = "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_run = _gpu_run(config)
    cuda = False
    if gpu_run:
        import torch

        cuda = torch.cuda.is_available()
    for item in items:
        is_gpu = "gpu" in item.keywords
        if is_gpu and not gpu_run:
            item.add_marker(pytest.mark.skip(reason="GPU test: run `pytest -m gpu` on a CUDA host"))
        elif is_gpu and not cuda:
            item.add_marker(pytest.mark.skip(reason="no CUDA device"))
        elif not is_gpu and gpu_run:
            item.add_marker(pytest.mark.skip(reason="CPU interpreter test: run without -m gpu"))
    # The slowest files first (pytest-xdist hands tests out in this order): their minutes-long
    # cases then overlap the short ones, rather than running alone at the end of the run
    items.sort(key=lambda item: item.path.name not in SLOW_FILES)  # a stable sort: order kept within


@pytest.fixture
def fresh_compiler():
    """A test that compiles: Dynamo reset and epilab's decisions cleared before and after,
    Inductor's caches off, so that every compilation runs epilab's pass."""
    import torch

    import epilab

    torch._dynamo.reset()
    epilab.explain(clear=True)
    with torch._inductor.config.patch(force_disable_caches=True):
        yield
    torch._dynamo.reset()


PG_URL = os.environ.get("EPILAB_TEST_POSTGRES_URL")


@functools.cache
def _worker_database(url: str) -> str:
    """The server's database for this process: ``url``'s own, or under pytest-xdist (the
    README's ``-n auto``) one of each worker's, made on first use, so that no worker empties
    another's tables mid-test."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return url
    import sqlalchemy as sa

    base = sa.engine.make_url(url)
    name = f"{base.database}_{worker}"
    engine = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        if (
            conn.execute(sa.text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).scalar()
            is None
        ):
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return base.set(database=name).render_as_string(hide_password=False)


def _reset_postgres(url: str) -> str:
    """This process's database (``_worker_database``), emptied; returns its URL."""
    import sqlalchemy as sa

    url = _worker_database(url)
    engine = sa.create_engine(url)
    with engine.begin() as conn:  # ours and optuna's tables alike
        conn.execute(sa.text("DROP SCHEMA public CASCADE"))
        conn.execute(sa.text("CREATE SCHEMA public"))
    engine.dispose()
    return url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_target(request, tmp_path) -> str:
    """A new, empty database: an SQLite file, and (with ``EPILAB_TEST_POSTGRES_URL`` set, as
    CI does) the PostgreSQL server's, emptied."""
    if request.param == "postgres":
        if not PG_URL:
            pytest.skip("set EPILAB_TEST_POSTGRES_URL to run against PostgreSQL")
        return _reset_postgres(PG_URL)
    return str(tmp_path / "tuning.db")


@pytest.fixture(params=[pytest.param("postgres", marks=pytest.mark.postgres)])
def pg_target() -> str:
    """The PostgreSQL server's database, emptied: for what only PostgreSQL does."""
    if not PG_URL:
        pytest.skip("set EPILAB_TEST_POSTGRES_URL to run against PostgreSQL")
    return _reset_postgres(PG_URL)
