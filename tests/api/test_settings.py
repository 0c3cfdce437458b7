"""ConductorSettings through load_settings: precedence, secrets, defaults, and one readable
line per problem naming where the bad value came from."""

import math
import os
from pathlib import Path

import pytest

from backend.policy.config import PolicyConfig
from backend.settings import ConductorSettings, SettingsError, load_settings

KEY_A = "alice-key-0123456789"
KEY_B = "bob-key-0123456789ab"
ADMIN = "admin-token-0123456789"
AGENT = "agent-secret-0123456789"
SECRETS = {"api_keys": f"alice:{KEY_A}", "admin_token": ADMIN, "agent_secret": AGENT}


@pytest.fixture(autouse=True)
def no_kvc_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees only the KVC_ variables it sets itself."""
    for name in list(os.environ):
        if name.upper().startswith("KVC_"):
            monkeypatch.delenv(name)


def write(tmp_path: Path, text: str, name: str = "conductor.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems(flags: dict, config_file: Path | None = None) -> list[str]:
    with pytest.raises(SettingsError) as caught:
        load_settings(flags, config_file)
    text = str(caught.value)
    assert "Traceback" not in text and "pydantic" not in text and "validation error" not in text
    assert text.splitlines() == caught.value.problems
    return caught.value.problems


def test_defaults_listen_on_loopback_and_keep_data_under_data_dir() -> None:
    settings = load_settings(SECRETS)
    assert settings.host == "127.0.0.1"
    assert settings.grpc_host == "127.0.0.1"
    assert settings.port == 8000
    assert settings.data_dir == Path("data")
    assert settings.database_url == "sqlite:///data/kvcentric.db"
    assert settings.policy_config() == PolicyConfig()


def test_database_defaults_follow_data_dir(tmp_path: Path) -> None:
    settings = load_settings({**SECRETS, "data_dir": tmp_path / "state"})
    assert settings.database_url == f"sqlite:///{tmp_path}/state/kvcentric.db"


@pytest.mark.parametrize(
    ("with_flag", "with_env", "with_file", "expected_port"),
    [
        (True, True, True, 3333),
        (False, True, True, 2222),
        (False, False, True, 1111),
        (False, False, False, 8000),
    ],
)
def test_flags_beat_environment_beats_file_beats_defaults(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    with_flag: bool,
    with_env: bool,
    with_file: bool,
    expected_port: int,
) -> None:
    flags = {**SECRETS, "port": 3333 if with_flag else None}
    if with_env:
        monkeypatch.setenv("KVC_PORT", "2222")
    config = write(tmp_path, 'port = 1111\nhost = "10.0.0.5"\n') if with_file else None
    settings = load_settings(flags, config)
    assert settings.port == expected_port
    assert settings.host == ("10.0.0.5" if with_file else "127.0.0.1")


def test_each_source_contributes_its_own_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVC_REJECTION_POLICY", "early")
    monkeypatch.setenv("KVC_KVCACHE_BALANCING_THRESHOLD", "inf")
    config = write(
        tmp_path,
        'prefill_scheduler = "cache-aware"\nrejection_policy = "baseline"\nblock_size = 16\n'
        "ttft_slo_s = 5.0\ntbt_slo_s = 0.05\ndecode_time_s = 12.5\n",
    )
    settings = load_settings({**SECRETS, "block_size": 64}, config)
    assert settings.policy_config() == PolicyConfig(
        block_size=64,
        prefill_scheduler="cache-aware",
        kvcache_balancing_threshold=math.inf,
        rejection_policy="early",
        ttft_slo_s=5.0,
        tbt_slo_s=0.05,
        decode_time_s=12.5,
    )


def test_config_file_from_environment_unless_a_flag_names_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVC_CONFIG_FILE", str(write(tmp_path, "port = 1111\n", "env.toml")))
    assert load_settings(SECRETS).port == 1111
    assert load_settings(SECRETS, write(tmp_path, "port = 1212\n", "flag.toml")).port == 1212


def test_secrets_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVC_API_KEYS", f"alice:{KEY_A}, {KEY_B}")
    monkeypatch.setenv("KVC_ADMIN_TOKEN", ADMIN)
    monkeypatch.setenv("KVC_AGENT_SECRET", AGENT)
    monkeypatch.setenv("KVC_DATABASE_URL", "postgresql+psycopg://kvc:pw@db:5432/kvc")
    settings = load_settings({})
    assert [(k.name, k.key.get_secret_value()) for k in settings.api_keys] == [
        ("alice", KEY_A),
        (settings.api_keys[1].name, KEY_B),
    ]
    assert settings.api_keys[1].name.startswith("key-")  # a stable name that hides the key
    assert settings.admin_token is not None and settings.admin_token.get_secret_value() == ADMIN
    assert settings.agent_secret is not None
    assert settings.agent_secret.get_secret_value() == AGENT
    assert settings.database_url == "postgresql+psycopg://kvc:pw@db:5432/kvc"
    shown = repr(settings)
    assert KEY_A not in shown and KEY_B not in shown and ADMIN not in shown and AGENT not in shown


def test_api_keys_as_a_list_in_the_config_file(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        f'api_keys = ["alice:{KEY_A}", "bob:{KEY_B}"]\n'
        f'admin_token = "{ADMIN}"\nagent_secret = "{AGENT}"\n',
    )
    assert [k.name for k in load_settings({}, config).api_keys] == ["alice", "bob"]


def test_refuses_to_start_without_secrets() -> None:
    lines = problems({})
    assert len(lines) == 3
    for line, env in zip(
        lines, ("KVC_API_KEYS", "KVC_ADMIN_TOKEN", "KVC_AGENT_SECRET"), strict=True
    ):
        assert env in line and "--dev" in line


def test_dev_mode_generates_missing_secrets_and_announces_them_once() -> None:
    shown: list[str] = []
    settings = load_settings({"dev": True, "admin_token": ADMIN}, announce=shown.append)
    assert settings.admin_token is not None and settings.admin_token.get_secret_value() == ADMIN
    assert settings.agent_secret is not None and settings.api_keys[0].name == "dev"
    key = settings.api_keys[0].key.get_secret_value()
    secret = settings.agent_secret.get_secret_value()
    assert len(key) >= 16 and len(secret) >= 16 and key != secret
    text = "\n".join(shown)
    assert text.count(key) == 1 and text.count(secret) == 1
    assert ADMIN not in text  # only what was generated is shown
    other = load_settings({"dev": True}, announce=lambda line: None)
    assert other.api_keys[0].key.get_secret_value() != key


def test_nothing_is_announced_when_dev_mode_has_every_secret() -> None:
    shown: list[str] = []
    load_settings({**SECRETS, "dev": True}, announce=shown.append)
    assert shown == []


def test_settings_are_frozen() -> None:
    settings = load_settings(SECRETS)
    with pytest.raises(ValueError):
        settings.port = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("env", "flags", "expected"),
    [
        ({"KVC_PORT": "0"}, {}, "KVC_PORT: must be between 1 and 65535, got 0"),
        ({"KVC_PORT": "http"}, {}, "KVC_PORT: must be an integer, got 'http'"),
        ({}, {"port": 70000}, "--port: must be between 1 and 65535, got 70000"),
        (
            {"KVC_PREFILL_SCHEDULER": "fastest"},
            {},
            "KVC_PREFILL_SCHEDULER: must be one of 'kvcache-centric', 'cache-aware', "
            "'load-balancing' or 'random', got 'fastest'",
        ),
        (
            {"KVC_REJECTION_POLICY": "late"},
            {},
            "KVC_REJECTION_POLICY: must be one of 'none', 'baseline', 'early' or "
            "'early-predicted', got 'late'",
        ),
        (
            {"KVC_KVCACHE_BALANCING_THRESHOLD": "0.5"},
            {},
            "KVC_KVCACHE_BALANCING_THRESHOLD: must be at least 1.0, got 0.5",
        ),
        ({"KVC_TTFT_SLO_S": "-1"}, {}, "KVC_TTFT_SLO_S: must be greater than 0.0, got -1"),
        ({"KVC_TBT_SLO_S": "inf"}, {}, "KVC_TBT_SLO_S: must be a finite number, got inf"),
        ({}, {"decode_time_s": 0}, "--decode-time-s: must be greater than 0.0, got 0"),
        ({}, {"block_size": 0}, "--block-size: must be greater than 0, got 0"),
        ({"KVC_DEV": "maybe"}, {}, "KVC_DEV: must be true or false, got 'maybe'"),
        (
            {},
            {"max_request_body_bytes": 10},
            "--max-request-body-bytes: must be at least 1024, got 10",
        ),
        (
            {},
            {"log_level": "loud"},
            "--log-level: must be one of 'debug', 'info', 'warning' or 'error', got 'loud'",
        ),
        ({}, {"prot": 1}, "--prot: unknown setting (did you mean 'port'?)"),
        (
            {"KVC_HEARTBEAT_TIMEOUT_S": "0.5"},
            {},
            "heartbeat_timeout_s (0.5) must be longer than heartbeat_interval_s (1), or live "
            "agents are declared dead between two heartbeats",
        ),
        (
            {"KVC_DATABASE_URL": "postgres://kvc:hunter2@db/kvc"},
            {},
            "KVC_DATABASE_URL: use the postgresql:// scheme (SQLAlchemy refuses postgres://)",
        ),
        (
            {"KVC_DATABASE_URL": "mysql://kvc:hunter2@db/kvc"},
            {},
            "KVC_DATABASE_URL: must be a sqlite:// or postgresql[+driver]:// URL, "
            "got scheme 'mysql'",
        ),
        (
            {"KVC_ADMIN_TOKEN": "short-secret"},
            {"admin_token": None},
            "KVC_ADMIN_TOKEN: must be at least 16 characters",
        ),
        (
            {"KVC_API_KEYS": f"alice:{KEY_A},bad name:{KEY_B}"},
            {"api_keys": None},
            "KVC_API_KEYS: entry 2: name: must be 1-64 letters, digits, '_', '.', '@' or '-' "
            "(starting with a letter or digit), got 'bad name'",
        ),
        (
            {"KVC_API_KEYS": f"alice:{KEY_A},bob:tiny"},
            {"api_keys": None},
            "KVC_API_KEYS: entry 2: key: must be at least 16 characters",
        ),
        (
            {"KVC_API_KEYS": f"alice:{KEY_A},alice:{KEY_B}"},
            {"api_keys": None},
            "KVC_API_KEYS: each key needs its own name; repeated: alice",
        ),
        (
            {"KVC_API_KEYS": f"admin:{KEY_A}"},
            {"api_keys": None},
            "KVC_API_KEYS: entry 1: name: 'admin' is reserved for the admin token",
        ),
        (
            {"KVC_API_KEYS": f"alice:{ADMIN}"},
            {"api_keys": None},
            "admin_token must differ from every API key",
        ),
        (
            {"KVC_AGENT_SECRET": ADMIN},
            {"agent_secret": None},
            "agent_secret must differ from the admin token and every API key",
        ),
    ],
)
def test_each_problem_is_one_line_naming_its_source(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], flags: dict, expected: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert problems({**SECRETS, **flags}) == [expected]


def test_secret_values_never_appear_in_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVC_ADMIN_TOKEN", "hunter2-short")
    monkeypatch.setenv("KVC_DATABASE_URL", "mysql://kvc:hunter2@db/kvc")
    text = "\n".join(problems({**SECRETS, "admin_token": None}))
    assert "hunter2" not in text


def test_every_problem_is_reported_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVC_PORT", "0")
    assert problems({"block_size": -1, "rejection_policy": "late"}) == [
        "KVC_PORT: must be between 1 and 65535, got 0",
        "--block-size: must be greater than 0, got -1",
        "--rejection-policy: must be one of 'none', 'baseline', 'early' or "
        "'early-predicted', got 'late'",
    ]


def test_a_flag_error_is_named_by_the_flag_even_with_the_variable_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KVC_PORT", "8080")
    assert problems({**SECRETS, "port": 0}) == ["--port: must be between 1 and 65535, got 0"]


def test_config_file_errors_name_the_file_and_line(tmp_path: Path) -> None:
    config = write(tmp_path, '# tuning\nhost = "0.0.0.0"\nport = 0\nprot = 9\n')
    assert problems(SECRETS, config) == [
        f"config file {config}: line 3: port: must be between 1 and 65535, got 0",
        f"config file {config}: line 4: prot: unknown setting (did you mean 'port'?)",
    ]


def test_config_file_syntax_errors_name_the_line(tmp_path: Path) -> None:
    config = write(tmp_path, "port = 8000\n\nhost = \n")
    [line] = problems(SECRETS, config)
    assert line.startswith(f"config file {config}: line 3: invalid value")


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        (lambda d: d / "missing.toml", "not found"),
        (lambda d: d, "is a directory, not a TOML file"),
        (lambda d: write(d, "config_file = 'other.toml'\n"), "line 1: config_file: cannot be"),
    ],
)
def test_unusable_config_files_are_refused(tmp_path: Path, setup, expected: str) -> None:
    config = setup(tmp_path)
    [line] = problems(SECRETS, config)
    assert line.startswith(f"config file {config}: {expected}")


def test_a_missing_config_file_named_by_the_environment_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVC_CONFIG_FILE", str(tmp_path / "nope.toml"))
    assert problems(SECRETS) == [f"config file {tmp_path / 'nope.toml'}: not found"]


def test_constructing_directly_validates_too() -> None:
    with pytest.raises(ValueError):
        ConductorSettings(port=0, **SECRETS)


def test_the_api_limits_come_from_the_settings() -> None:
    from backend.api.routes import default_limits
    from tests.runtime.conftest import make_settings

    limits = default_limits(
        make_settings(served_model="llama-tiny", max_input_tokens=100, max_output_tokens=7)
    )
    assert limits.models == ("llama-tiny",)
    assert (limits.max_input_tokens, limits.max_output_tokens) == (100, 7)
