"""Real training data without a network: a reader of IDX files (the format of
MNIST and Fashion-MNIST) and Fashion-MNIST from Debian's
``dataset-fashion-mnist`` (60,000 training + 10,000 test 28x28 grey images,
10 classes)::

    from blkps import datasets
    images, labels = datasets.fashion_mnist("train")   # uint8 (N, 28, 28), (N,)

Numpy only; nothing is downloaded.
"""

import gzip
import os

import numpy as np

__all__ = ["FASHION_MNIST_DIR", "FASHION_MNIST_CLASSES", "read_idx", "fashion_mnist"]

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                         "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")

# IDX: big-endian; magic = 0x00 0x00 <element type> <dimensions>, then one
# uint32 per dimension, then the elements, row-major.
_IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path):
    """Returns the array in IDX file `path` (gzip-compressed if it ends in
    .gz). Raises ValueError naming the file when it is not a whole IDX file."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_TYPES:
        raise ValueError(f"{path}: not an IDX file (bad magic {data[:4].hex()})")
    dtype, ndim = np.dtype(_IDX_TYPES[data[2]]), data[3]
    header = 4 + 4 * ndim
    shape = tuple(int(d) for d in np.frombuffer(data, ">u4", ndim, 4)) if ndim else ()
    want = header + dtype.itemsize * int(np.prod(shape))
    if len(data) != want:
        raise ValueError(f"{path}: IDX shape {shape} needs {want} bytes, the file has {len(data)}")
    return np.frombuffer(data, dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def fashion_mnist(split, root=FASHION_MNIST_DIR):
    """Returns (images uint8 (N, 28, 28), labels uint8 (N,)) of split "train"
    (N = 60,000) or "test" (N = 10,000) from `root`."""
    prefix = {"train": "train", "test": "t10k"}.get(split)
    if prefix is None:
        raise ValueError(f"fashion_mnist: split must be 'train' or 'test', got {split!r}")
    paths = [os.path.join(root, f"{prefix}-{kind}-ubyte.gz") for kind in ("images-idx3", "labels-idx1")]
    for path in paths:
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: missing; install Debian's dataset-fashion-mnist "
                                    "(scripts/setup.sh does)")
    images, labels = (read_idx(p) for p in paths)
    if images.ndim != 3 or labels.shape != images.shape[:1]:
        raise ValueError(f"{root}: {split} images {images.shape} and labels {labels.shape} do not match")
    return images, labels
