#!/usr/bin/env python3
# kiln — header-only C++20 tensor compiler.
# SPDX-License-Identifier: Apache-2.0
#
# Regenerates the polynomial coefficients of include/kiln/codegen/device/cpu_math.hpp.
# Takes nothing (needs python3-mpmath); prints, per polynomial and precision, the
# approximation error before and after rounding the coefficients, then the
# coefficients lowest degree first, as pasted into the header.
# Each is a Chebyshev interpolant (near-minimax) of a smooth function on the reduced
# range, fitted with 50 digits; the series forms avoid cancellation near 0.
import struct

from mpmath import chebyfit, erfc, exp, factorial, linspace, log, mp, mpf, pi, sqrt

mp.dps = 50


def f32(v):
    return struct.unpack('f', struct.pack('f', float(v)))[0]


def series(cs):
    return lambda z: sum(c * z**n for n, c in enumerate(cs))


# expm1(r) = r + r^2 P(r), |r| <= ln2/2 (+2%)
exp_p = series([mpf(1) / factorial(n + 2) for n in range(60)])
# 2 atanh(s) = 2s + s^3 T(s^2): T(z) = sum 2 z^n / (2n + 3), z <= ((sqrt2-1)/(sqrt2+1))^2
log_t = series([mpf(2) / (2 * n + 3) for n in range(80)])
# sin r = r + r^3 S(r^2), cos r = 1 - r^2/2 + r^4 C(r^2), |r| <= pi/4 (+1%)
sin_s = series([(-1)**(n + 1) / factorial(2 * n + 3) for n in range(40)])
cos_c = series([(-1)**n / factorial(2 * n + 4) for n in range(40)])
# erf x = x A(x^2), |x| < 1
erf_a = series([2 / sqrt(pi) * (-1)**n / (factorial(n) * (2 * n + 1)) for n in range(80)])
# float, 1 <= |x| < 3.92: erfc = e^(H - x^2), H = log erfc + x^2, in u = |x| - 2.46
erf_h = lambda u: (lambda x: log(erfc(x)) + x * x)(u + mpf('2.46'))
# double, 1 <= |x| < 6: erfc = e^(-x^2) F, F = erfc e^(x^2), in v = 1/(1+|x|) - 9/28
c9 = mpf(9) / 28
erf_fi = lambda v: (lambda x: erfc(x) * exp(x * x))(1 / (v + c9) - 1)

L = mpf('0.3466') * mpf('1.02')
Z = (pi / 4)**2 * mpf('1.02')
jobs = [  # name, function, range, float degree, double degree
    ('expm1 P', exp_p, -L, L, 5, 10),
    ('log T', log_t, 0, mpf('0.02944') * mpf('1.01'), 2, 7),
    ('sin S', sin_s, 0, Z, 3, 6),
    ('cos C', cos_c, 0, Z, 3, 5),
    ('erf A', erf_a, 0, 1, 6, 11),
    ('erf H', erf_h, -mpf('1.46'), mpf('1.46'), 8, None),
    ('erf F', erf_fi, 1 / mpf(7) - c9, 1 / mpf(2) - c9, None, 17),
]
for name, g, a, b, df, dd in jobs:
    for prec, deg in (('float', df), ('double', dd)):
        if deg is None:
            continue
        c, err = chebyfit(g, [a, b], deg + 1, error=True)
        c = c[::-1]
        cr = [f32(x) if prec == 'float' else float(x) for x in c]
        rerr = max(abs(series([mpf(x) for x in cr])(p) - g(p)) for p in linspace(a, b, 3001))
        fmt = (lambda v: '%.9gf' % v) if prec == 'float' else (lambda v: '%.17g' % v)
        print('// %s, %s, degree %d: error %s, %s with rounded coefficients' % (name, prec, deg, mp.nstr(err, 3), mp.nstr(rerr, 3)))
        print('   ' + ', '.join(fmt(v) for v in cr))
