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
