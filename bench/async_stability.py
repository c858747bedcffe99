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

Pipelined learners (doc/async.md "Pipelined learners"; gradient mode
only): with `delay` 1 a learner's gradient is taken at the pull before its
last (and the look-ahead from there). The server's rule counts N = max(N,
1+τ), τ the pushes since the read the gradient was taken on when the
server knows the learner's depth (`counted`), else since its last read.

Prints, per N, the largest per-round lr·curvature for which the weights do
not grow (bisection); one process (N = 1) is stable up to 2(1+μ) = 3.8.

  bench/async_stability.py
"""


def grows(n, mu, h, look_ahead=0.0, gradient_mode=False, pushes=3000, delay=0, counted=False):
    w = 1.0
    # Per learner, its pulls (oldest first) and the pushes applied before each.
    pulls = [[w] * (delay + 2) for _ in range(n)]
    at = [[0] * (delay + 2) for _ in range(n)]
    v = [0.0] * n
    for t in range(pushes):
        i = t % n
        x = pulls[i][-1 - delay] + look_ahead * (pulls[i][-1 - delay] - pulls[i][-2 - delay])
        if gradient_mode:
            tau = t - at[i][-1 - delay if counted else -1]
            share = max(n, 1 + tau)
            d = mu ** (1.0 / share)
            c = (1 - d) / (1 - mu)
            v[0] = d * v[0] + c * x
            w -= h / share * v[0]
        else:
            v[i] = mu * v[i] + x
            w -= h * v[i] / n
        pulls[i] = pulls[i][1:] + [w]
        at[i] = at[i][1:] + [t + 1]
        if abs(w) > 1e6:
            return True
    return abs(w) > 1.0


def largest_stable(n, mu, look_ahead=0.0, gradient_mode=False, delay=0, counted=False):
    lo, hi = 0.0, 8.0
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if grows(n, mu, mid, look_ahead, gradient_mode, delay=delay, counted=counted) else (mid, hi)
    return lo


if __name__ == "__main__":
    print("          delta mode (learners' momentum)               gradient mode (server momentum)")
    print("learners  mu 0.9  + look-ahead (N-1)/N  mu 0.8  mu 0.5  mu 0.9  + look-ahead (N-1)/N")
    for n in (1, 2, 4, 8):
        a = (n - 1) / n
        print(f"{n:8d}  {largest_stable(n, 0.9):6.2f}  {largest_stable(n, 0.9, a):20.2f}  "
              f"{largest_stable(n, 0.8):6.2f}  {largest_stable(n, 0.5):6.2f}  "
              f"{largest_stable(n, 0.9, 0.0, True):6.2f}  {largest_stable(n, 0.9, a, True):20.2f}")
    print()
    print("pipelined learners, gradient mode; a = (N-1)/N, look-ahead a + 1 the default")
    print("                 undelayed  delay, server counts from the last read   delay counted in tau")
    print("learners  mu     look a     look 0  look a  look a+1                  look 0  look a  look a+1")
    for mu in (0.9, 0.0):
        for n in (1, 2, 4, 8):
            a = (n - 1) / n
            row = [largest_stable(n, mu, a, True)]
            row += [largest_stable(n, mu, la, True, 1, False) for la in (0.0, a, a + 1)]
            row += [largest_stable(n, mu, la, True, 1, True) for la in (0.0, a, a + 1)]
            print(f"{n:8d}  {mu:3.1f}  {row[0]:8.2f}   {row[1]:8.2f}{row[2]:8.2f}{row[3]:10.2f}"
                  f"                  {row[4]:6.2f}{row[5]:8.2f}{row[6]:10.2f}")
