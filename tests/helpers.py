"""Assertions shared by the CPU and GPU tests."""

from __future__ import annotations

import torch

TREE_FIELDS = ("tokens", "parents", "depths", "num_nodes", "ancestor_mask")
VERDICT_FIELDS = ("accepted", "accept_len", "bonus", "tokens")


def assert_same_tree(a, b, atol: float = 1e-5) -> None:
    """Two DraftTrees are identical (scores within atol: fp32 sums in another order)."""
    for field in TREE_FIELDS:
        assert torch.equal(getattr(a, field), getattr(b, field)), field
    assert torch.allclose(a.scores, b.scores, atol=atol)


def assert_same_verdict(a, b) -> None:
    for field in VERDICT_FIELDS:
        assert torch.equal(getattr(a, field), getattr(b, field)), field


def chi_square_pvalue(samples, want: dict) -> float:
    """Pearson chi-square of sampled sequences (iterable of tuples) against exact probabilities.

    `want` is renormalised (float32-derived probabilities need not sum to 1 exactly); the rarest
    cells are pooled until each pooled cell expects at least 5. Fails on an impossible sequence.
    """
    from collections import Counter

    from scipy import stats

    samples = list(samples)
    counts = Counter(samples)
    assert set(counts) <= {s for s, p in want.items() if p > 0}, "emitted an impossible sequence"
    total = sum(want.values())
    obs, exp, acc_o, acc_e = [], [], 0.0, 0.0
    for s in sorted(want, key=want.get):
        acc_o += counts.get(s, 0)
        acc_e += want[s] / total * len(samples)
        if acc_e >= 5:
            obs.append(acc_o)
            exp.append(acc_e)
            acc_o = acc_e = 0.0
    if acc_e > 0:
        obs[-1] += acc_o
        exp[-1] += acc_e
    return float(stats.chisquare(obs, exp).pvalue)


def two_sample_chi_square_pvalue(a, b) -> float:
    """Chi-square test that two samples (iterables of hashable outcomes) come from one distribution.

    Outcomes are sorted by their pooled count and the rarest are merged until every merged cell
    expects at least 5 in each sample; p-value of the 2 x K contingency table.
    """
    from collections import Counter

    from scipy import stats

    ca, cb = Counter(a), Counter(b)
    na, nb = sum(ca.values()), sum(cb.values())
    rows, acc_a, acc_b = [], 0, 0
    for outcome in sorted(set(ca) | set(cb), key=lambda o: ca[o] + cb[o]):
        acc_a += ca[outcome]
        acc_b += cb[outcome]
        pooled = (acc_a + acc_b) / (na + nb)
        if pooled * min(na, nb) >= 5:
            rows.append((acc_a, acc_b))
            acc_a = acc_b = 0
    if acc_a or acc_b:
        if rows:
            rows[-1] = (rows[-1][0] + acc_a, rows[-1][1] + acc_b)
        else:
            rows.append((acc_a, acc_b))
    if len(rows) < 2:
        return 1.0                                   # one cell: nothing to tell apart
    return float(stats.chi2_contingency(list(zip(*rows)), correction=False).pvalue)


def tree_node_path(tree, b: int, j: int) -> list[int]:
    """Request b's tokens from the root of its DDTree to node j (root included), by the parent links."""
    out = []
    while j >= 0:
        out.append(int(tree.tokens[b, j]))
        j = int(tree.parents[b, j])
    return out[::-1]


def informed_draft(target_logits, seq: list[int], depth: int, gen, noise: float):
    """Draft logits [L, V] that know the target a little: depth d's are target_logits(seq + the draft's own
    greedy path so far) plus noise x N(0, 1) - so trees are accepted past the root in CPU tests."""
    import torch

    rows = []
    for _ in range(depth):
        logits = target_logits(seq)
        row = logits + noise * torch.randn(logits.shape[-1], generator=gen)
        rows.append(row)
        seq = seq + [int(row.argmax())]
    return torch.stack(rows)


def self_signed(folder, name: str = "k26-gateway.test"):
    """A self-signed certificate for `name` and 127.0.0.1, and its key (PEM files)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .sign(key, hashes.SHA256()))
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / f"{name}.crt", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def speed_sweep_train(speed_dir, **env: str) -> str:
    """`testbed/speed_sweep.sh train` in SPEED_DIR=speed_dir on the CPU: the small size, seconds of training, two
    prompts for the offline accept count; `env` adds or overrides variables. Its stdout; the run must succeed."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run(["bash", "testbed/speed_sweep.sh", "train"], cwd=root, capture_output=True, text=True,
                       timeout=300, env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
                                         "SPEED_DIR": str(speed_dir), "TRAIN_DEVICE": "cpu", "TRAIN_SIZE": "small",
                                         "TRAIN_MINUTES": "0.03",
                                         "TRAIN_ARGS": "--batch 4 --seq 64 --distill-windows 8 --accept-prompts 2 "
                                                       "--accept-tokens 6", **env})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return r.stdout


def speed_sweep_snapshot(speed_dir, out):
    """`testbed/speed_sweep.sh snapshot` for SPEED_DIR=speed_dir with OUT=out -> the CompletedProcess (not checked)."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    return subprocess.run(["bash", "testbed/speed_sweep.sh", "snapshot"], cwd=root, capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "SPEED_DIR": str(speed_dir), "OUT": str(out)})
