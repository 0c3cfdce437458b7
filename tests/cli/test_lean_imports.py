"""The command line loads torch only for the commands that compute.

Every `kvcentric` command imports the whole command line first (one typer app), so a module
of it that imports torch at its top makes every command pay for it: the Conductor and the
load generator each spent about 2.5 s of CPU and a few hundred MB importing a library they
never call (found profiling the load generator during `twin validate`, where both share the
host with the agents they measure).
"""

import subprocess
import sys


def test_the_command_line_does_not_import_torch():
    # Any command's module runs backend/cli/__init__.py, which registers every command.
    module = "backend.cli.replay_cmd"
    done = subprocess.run(
        [sys.executable, "-c", f"import sys, {module}; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.strip() == "False", f"importing {module} imported torch"
