"""The value types of the commands' options (argparse's type=), one each."""


def positive_int(text):
    if not text.isdigit() or int(text) == 0:
        raise ValueError(text)
    return int(text)


positive_int.__name__ = "positive integer"  # argparse: "invalid positive integer value: '-1'"


def port_or_auto(text):
    if text != "auto" and not (text.isdigit() and 0 < int(text) < 65536):
        raise ValueError(text)
    return text


port_or_auto.__name__ = "port (or auto)"


def lease_ttl(text):
    """A lease's TTL: whole seconds, 2 or more (etcd's shortest is about 1.5 s)."""
    value = positive_int(text)
    if value < 2:
        raise ValueError(text)
    return value


lease_ttl.__name__ = "lease TTL in whole seconds (2 or more)"
