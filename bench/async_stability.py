#!/usr/bin/python3
"""The linear model behind doc/async.md "Look-ahead": one parameter, loss
x²/2 (curvature 1), N learners pushing in turn in async. Each learner takes
its gradient at the weights it pulled (plus look_ahead times the move since
its previous pull) and pushes; then it pulls.

- delta mode: the learner steps its own momentum μ and pushes 1/N of the
  step (server sum);
- gradient mode: the learner pushes the gradient, N-1 updates stale, and the
  server's momentum rule takes it as 1/N of a round (aggregator/update_rule.cc
  MomentumRule): v = d·v + c·g, w -= (lr/N)·v, d = μ^(1/N), c = (1-d)/(1-μ).

Prints, per N, the largest per-round lr·curvature for which the weights do
not grow (bisection); one process (N = 1) is stable up to 2(1+μ) = 3.8.

  bench/async_stability.py
"""


def grows(n, mu, h, look_ahead=0.0, gradient_mode=False, pushes=3000):
    w = 1.0
    v, pulled, previous = [0.0] * n, [w] * n, [w] * n
    d = mu ** (1.0 / n)
    c = (1 - d) / (1 - mu)
    for t in range(pushes):
        i = t % n
        x = pulled[i] + look_ahead * (pulled[i] - previous[i])
        if gradient_mode:
            v[0] = d * v[0] + c * x
            w -= h / n * v[0]
        else:
            v[i] = mu * v[i] + x
            w -= h * v[i] / n
        previous[i], pulled[i] = pulled[i], w
        if abs(w) > 1e6:
            return True
    return abs(w) > 1.0


def largest_stable(n, mu, look_ahead=0.0, gradient_mode=False):
    lo, hi = 0.0, 8.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if grows(n, mu, mid, look_ahead, gradient_mode) else (mid, hi)
    return lo


if __name__ == "__main__":
    print("          delta mode (learners' momentum)               gradient mode (server momentum)")
    print("learners  mu 0.9  + look-ahead (N-1)/N  mu 0.8  mu 0.5  mu 0.9  + look-ahead (N-1)/N")
    for n in (1, 2, 4, 8):
        a = (n - 1) / n
        print(f"{n:8d}  {largest_stable(n, 0.9):6.2f}  {largest_stable(n, 0.9, a):20.2f}  "
              f"{largest_stable(n, 0.8):6.2f}  {largest_stable(n, 0.5):6.2f}  "
              f"{largest_stable(n, 0.9, 0.0, True):6.2f}  {largest_stable(n, 0.9, a, True):20.2f}")
