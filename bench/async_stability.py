#!/usr/bin/python3
"""The linear model behind doc/async.md "Delta mode: look-ahead": one
parameter, loss x²/2 (curvature 1), N learners pushing in turn in async
delta mode. Each learner takes its gradient at the weights it pulled (plus
look_ahead times the move since its previous pull), steps its own momentum
μ, pushes 1/N of the step and pulls. Prints, per N, the largest per-round
lr·curvature for which the weights do not grow (bisection).

  bench/async_stability.py
"""


def grows(n, mu, h, look_ahead=0.0, pushes=3000):
    w = 1.0
    v, pulled, previous = [0.0] * n, [w] * n, [w] * n
    for t in range(pushes):
        i = t % n
        x = pulled[i] + look_ahead * (pulled[i] - previous[i])
        v[i] = mu * v[i] + x
        w -= h * v[i] / n
        previous[i], pulled[i] = pulled[i], w
        if abs(w) > 1e6:
            return True
    return abs(w) > 1.0


def largest_stable(n, mu, look_ahead=0.0):
    lo, hi = 0.0, 8.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if grows(n, mu, mid, look_ahead) else (mid, hi)
    return lo


if __name__ == "__main__":
    print("learners  mu 0.9  mu 0.9 + look-ahead (N-1)/N  mu 0.8  mu 0.5")
    for n in (1, 2, 4, 8):
        print(f"{n:8d}  {largest_stable(n, 0.9):6.2f}  {largest_stable(n, 0.9, (n - 1) / n):29.2f}  "
              f"{largest_stable(n, 0.8):6.2f}  {largest_stable(n, 0.5):6.2f}")
