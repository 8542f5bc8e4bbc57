"""``warmstart keys``: the people of a shared server, a key each (runtime/users.py).

The key is printed once, by ``add``, and kept nowhere: the file holds its salted hash.
A running server reads the file again when it changes, so no restart is needed.
Output here is the CLI's own: print is allowed."""

from __future__ import annotations

import argparse
import datetime
import os

from ..users import add_user, check_name, read_users, remove_user
from ._flags import settings_from


def cmd_keys(args: argparse.Namespace) -> int:
    path = settings_from(args).effective_keys_file
    if args.action == "list":
        users = read_users(path)
        for user in users:
            when = datetime.datetime.fromtimestamp(user.created).strftime("%Y-%m-%d %H:%M")
            group = f"  cache shared with group {user.cache_group}" if user.cache_group else ""
            print(f"{user.name}  added {when}{group}")
        if not users:
            print(f"no keys in {path}")
        return 0
    name = check_name(args.name)
    if args.action == "remove":
        if not remove_user(path, name):
            print(f"warmstart: no key for {name!r} in {path}")
            return 1
        print(f"removed {name}'s key: the server refuses it from now on")
        return 0
    old = os.umask(0o077)  # the folder too, when this creates it
    try:
        key = add_user(path, name, args.cache_group)
    finally:
        os.umask(old)
    print(f"added {name}. Their key, shown this once and stored nowhere:\n\n    {key}\n")
    print("They send it as 'Authorization: Bearer <key>' (the api_key of an OpenAI client).")
    return 0
