"""Names vulture reports as unused that are not dead code (read by vulture, never run).

Each line is a use of the name; keep it to true false positives, each with the reason.
"""

# Context managers' __exit__ takes the exception triple by protocol, used or not
# (compaction_worker/local/embedded.py, compaction_worker/testing).
exc_type
tb

# pydantic-settings calls settings_customise_sources with every source by keyword; the
# settings leave these two out of the order they return (compaction_worker/settings.py).
dotenv_settings
file_secret_settings

# A Protocol method's parameter names the keyword its implementations take (pydantic's
# model_dump), never used in the protocol's own body (compaction_worker/formats/openai_chat.py).
exclude_none
