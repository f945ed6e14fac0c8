"""The command line: flags generated from the config dataclasses (:mod:`engine.cli.args`), YAML
presets (:mod:`engine.cli.presets`), prompt files (:mod:`engine.cli.prompts`) and the job
(:mod:`engine.cli.main`)."""
