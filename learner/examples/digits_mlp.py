"""The digits model shared by the example learners: the data split and a
small MLP with its flat parameter layout. No I/O: the learners differ only in
how they move the flat vector to and from the model device.

The data is Debian's python3-sklearn copy of the UCI digits (1797 8x8
images, 10 classes), split 75/25 with a fixed seed; learner K of N trains on
every N-th training example starting at K (learner_data).

The flat parameter vector (float32; parameter i at device byte 4*i) is
W1 (64 x hidden, row-major), b1 (hidden), W2 (hidden x 10), b2 (10).
"""
import sys
import time

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

INPUTS, CLASSES = 64, 10


class Mlp:
    """64 -> hidden (ReLU) -> 10 (softmax). The flat parameter vector is laid
    out as W1 (64 x hidden), b1, W2 (hidden x 10), b2: the device layout."""

    def __init__(self, hidden):
        self.shapes = [(INPUTS, hidden), (hidden,), (hidden, CLASSES), (CLASSES,)]
        self.num_params = sum(int(np.prod(s)) for s in self.shapes)

    def unflatten(self, flat):
        """Views (no copies) of W1, b1, W2, b2 over the flat vector."""
        parts, at = [], 0
        for s in self.shapes:
            n = int(np.prod(s))
            parts.append(flat[at:at + n].reshape(s))
            at += n
        return parts

    def forward(self, flat, x):
        w1, b1, w2, b2 = self.unflatten(flat)
        h = np.maximum(x @ w1 + b1, 0.0)
        logits = h @ w2 + b2
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        return h, p

    def loss_and_gradient(self, flat, x, y):
        """Mean cross-entropy over the batch, its gradient as one flat float32
        vector in the parameter layout, and the class probabilities."""
        w1, b1, w2, b2 = self.unflatten(flat)
        h, p = self.forward(flat, x)
        n = x.shape[0]
        loss = -np.log(p[np.arange(n), y] + 1e-12).mean()
        dlogits = p.copy()
        dlogits[np.arange(n), y] -= 1.0
        dlogits /= n
        dw2 = h.T @ dlogits
        db2 = dlogits.sum(axis=0)
        dh = (dlogits @ w2.T) * (h > 0)
        dw1 = x.T @ dh
        db1 = dh.sum(axis=0)
        grad = np.concatenate([dw1.ravel(), db1, dw2.ravel(), db2]).astype(np.float32)
        return loss, grad, p

    def accuracy(self, flat, x, y):
        return float((self.forward(flat, x)[1].argmax(axis=1) == y).mean())


def load_data():
    """x_train, x_test, y_train, y_test: pixels scaled to [0, 1], float32."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    return train_test_split(x, digits.target, test_size=0.25, random_state=0, stratify=digits.target)


def learner_data(learner, learners, batch):
    """Learner K of N's training examples (every N-th, starting at K) and its
    iterations per epoch of `batch` examples. Every learner does the same
    number of iterations (their shares differ by at most one image): in bsp a
    learner that stopped early would hold the others back until the server
    declares it dead."""
    x_train, _, y_train, _ = load_data()
    steps = max(1, len(x_train) // learners // batch)
    return x_train[learner::learners], y_train[learner::learners], steps


def learner_rng(learner):
    """The minibatch order's random generator of learner K."""
    return np.random.default_rng(1000 + learner)


def count(text, least=1):
    """argparse type: an integer >= least (--epochs -1 once ran 0 epochs and
    reported the untrained model's accuracy)."""
    value = int(text)
    if value < least:
        raise ValueError(text)
    return value


count.__name__ = "positive integer"


def index(text):
    return count(text, least=0)


index.__name__ = "non-negative integer"


def add_learner_arguments(ap):
    """The options every digits learner takes besides --target, so that they
    all have one command line (argparse parser `ap`)."""
    ap.add_argument("--params", action="store_true", help="print the parameter count and exit")
    ap.add_argument("--evaluate", action="store_true", help="print held-out test accuracy and exit")
    ap.add_argument("--min-accuracy", type=float, help="with --evaluate: fail below this accuracy")
    ap.add_argument("--learner", type=index, default=0, help="this learner's index (default 0)")
    ap.add_argument("--learners", type=count, default=1, help="number of learners (default 1)")
    ap.add_argument("--epochs", type=count, default=20, help="passes over this learner's data (default 20)")
    ap.add_argument("--sync", action="store_true", help="fsync the device when done: the server checkpoints")
    ap.add_argument("--batch", type=count, default=32, help="minibatch size (default 32)")
    ap.add_argument("--hidden", type=count, default=128, help="hidden units (default 128)")
    ap.add_argument("--start-gate", action="store_true",
                    help="once the data is loaded and the model open, print 'learner K: ready' and wait for "
                         "a line on stdin before training (blkps demo starts its learners together so)")


def run_learner(prog, ap, args, num_params, train, evaluate):
    """The common tail of a digits learner's main(): --params prints
    `num_params`; otherwise it checks --target and --learner, then runs
    `evaluate(args)` or `train(args)`, turning an OSError or ValueError into
    one line `prog: ...` and a non-zero exit."""
    if args.params:
        print(num_params)
        return
    if not args.target:
        ap.error("--target is required")
    if not 0 <= args.learner < args.learners:
        ap.error(f"--learner must be in [0, {args.learners})")
    try:
        evaluate(args) if args.evaluate else train(args)
    except OSError as e:
        sys.exit(f"{prog}: {e.filename or args.target}: {e.strerror or e}")
    except ValueError as e:
        sys.exit(f"{prog}: {e}")


def wait_at_start_gate(args):
    """The start gate (--start-gate): says this learner is ready and waits
    for the line that starts every learner at once, so that none trains
    alone while another is still importing or loading its data."""
    if not args.start_gate:
        return
    sys.stdout.write(f"learner {args.learner}: ready\n")
    sys.stdout.flush()
    if not sys.stdin.readline():
        sys.exit(f"learner {args.learner}: the start gate closed (stdin ended) before the start")


def warn_if_device_larger(prog, device_bytes, num_params):
    """Warns (stderr) when the device holds many more parameters than this
    model uses: the rest is never trained, and a server started for another
    model (its --bsopts params=) is the likely cause."""
    if device_bytes >= 4 * num_params + 4096:
        print(f"{prog}: warning: the device holds {device_bytes // 4} parameters but this model uses "
              f"{num_params}; the rest is never trained (start the server with params={num_params})",
              file=sys.stderr, flush=True)


def report_accuracy(prog, accuracy, images, min_accuracy):
    """Prints the held-out accuracy; exits non-zero below min_accuracy."""
    print(f"held-out test accuracy: {accuracy:.4f} ({images} images)")
    if min_accuracy is not None and accuracy < min_accuracy:
        sys.exit(f"{prog}: test accuracy {accuracy:.4f} is below --min-accuracy {min_accuracy}")


class EpochMeter:
    """A learner's progress line per epoch: mean loss and training accuracy
    over the epoch, and the push and pull rates since the start.

        meter = EpochMeter(learner)
        weights = meter.timed_pull(pull, nbytes)   # returns pull()'s result
        meter.timed_push(push, nbytes)
        meter.add_batch(loss, correct, seen)
        meter.end_epoch()                           # prints, starts a new epoch
    """

    def __init__(self, learner):
        self.tag = f"learner {learner}"
        self.epoch = self.step = 0
        self.pulled = self.pushed = 0
        self.pull_seconds = self.push_seconds = 0.0
        self._reset_window()

    def _reset_window(self):
        self.loss_sum, self.correct, self.seen = 0.0, 0, 0

    def timed_pull(self, pull, nbytes):
        t0 = time.perf_counter()
        result = pull()
        self.pull_seconds += time.perf_counter() - t0
        self.pulled += nbytes
        return result

    def timed_push(self, push, nbytes):
        t0 = time.perf_counter()
        push()
        self.push_seconds += time.perf_counter() - t0
        self.pushed += nbytes

    def add_batch(self, loss, correct, seen):
        self.loss_sum += loss * seen
        self.correct += correct
        self.seen += seen
        self.step += 1

    def end_epoch(self):
        self.epoch += 1
        # One write of the whole line: learners sharing a terminal or pipe
        # (print writes the text and the newline apart when unbuffered) must
        # not run their lines together.
        line = (f"{self.tag}: epoch {self.epoch:3d} iteration {self.step:5d} "
                f"loss {self.loss_sum / self.seen:.4f} train-accuracy {self.correct / self.seen:.3f} "
                f"pushed {self.pushed / 1e6 / self.push_seconds:7.1f} MB/s "
                f"pulled {self.pulled / 1e6 / self.pull_seconds:7.1f} MB/s\n")
        sys.stdout.write(line)
        sys.stdout.flush()
        self._reset_window()
