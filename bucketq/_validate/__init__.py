"""Every value that enters bucketq, checked where it enters: one module per job.

- :mod:`.checks`: the checks (a value and its name in, the value or a
  ``ConfigurationError`` naming it out);
- :mod:`.options`: options declared once and read from keywords, the environment or
  text;
- :mod:`.tables`: the settings as the docs' tables;
- :mod:`.cli`: what the commands share (argparse types, ``--mongodb-uri`` and its rule,
  deprecated command names);
- :mod:`.lines`: text made fit for one line of a log or of stderr.

The package's names are those of its modules, so ``from bucketq import _validate as v``
and ``v.count``, ``v.option``, ``v.cli_count`` read the same everywhere.
"""

from .checks import (
    MAX_DELAY,
    MAX_OPTION_SECONDS,
    MAX_TIMESTAMP,
    MONGODB_SCHEMES,
    REDIS_SCHEMES,
    choice,
    collection_name,
    count,
    database_name,
    delay,
    flag,
    headers,
    number,
    optional_number,
    partition_key,
    payloads,
    text,
    timeout,
    timestamp,
    url,
    write_concern,
)
from .cli import (
    FROM_STORE,
    STARTS_ONE,
    add_mongodb_uri,
    cli_count,
    cli_count_list,
    cli_number,
    cli_type,
    cli_url,
    deprecated_alias,
    mongodb_uri,
    require_mongodb_uri,
)
from .lines import counted, one_line, printable
from .options import (
    MONGODB_URI_ENV,
    Setting,
    check_options,
    env_mongodb_uri,
    env_var,
    maybe,
    option,
    parse,
    read_env,
    read_text,
    reader,
    reads,
    setting_of,
    settings,
)
from .tables import settings_table

__all__ = [
    "FROM_STORE", "MAX_DELAY", "MAX_OPTION_SECONDS", "MAX_TIMESTAMP", "MONGODB_SCHEMES",
    "MONGODB_URI_ENV", "REDIS_SCHEMES", "STARTS_ONE", "Setting", "add_mongodb_uri",
    "check_options", "choice", "cli_count", "cli_count_list", "cli_number", "cli_type",
    "cli_url", "collection_name", "count", "counted", "database_name", "delay", "deprecated_alias",
    "env_mongodb_uri", "env_var", "flag", "headers", "maybe", "mongodb_uri", "number",
    "one_line", "option", "optional_number", "parse", "partition_key", "payloads",
    "printable", "read_env", "read_text", "reader", "reads", "require_mongodb_uri",
    "setting_of", "settings", "settings_table", "text", "timeout", "timestamp", "url",
    "write_concern",
]  # fmt: skip
