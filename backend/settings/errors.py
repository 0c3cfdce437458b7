"""SettingsError: the one exception a bad configuration raises, one readable line per problem."""


class SettingsError(ValueError):
    """Why the Conductor refuses to start; `str()` is one line per problem, no traceback."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))
