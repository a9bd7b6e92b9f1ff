//! Sizes, durations, signals, templates and patterns as people write them in `PINGUARD_*` variables and CLI flags.

/// A size that may be relative to the memory the process can have.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SizeSpec {
    Bytes(u64),
    /// Percent (0 < p <= 100) of the cgroup memory limit, else of `MemTotal`.
    Percent(f64),
}

pub const SIZE_FORMS: &str = "bytes such as 1073741824, 512Mi, 8Gi, 1.5GiB, 2T (K/M/G/T and Ki/Mi/Gi/Ti alike = powers of 1024)";

/// Parses `1073741824`, `512Mi`, `8Gi`, `1.5GiB`, `2T`, `64kb`: K/M/G/T/P are powers of 1024,
/// followed by nothing, `B`, `i` (Kubernetes' binary suffixes) or `iB`; case does not matter. A
/// fraction needs a unit (no fractional bytes). Kubernetes reads a bare `G` as 10^9: pinguard
/// keeps 1024^3 for it (what every earlier setting meant), and the docs prefer `Gi`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t.starts_with('-') {
        return Err("negative sizes are not allowed".into());
    }
    // `1e9`, `2E3`: a float's notation, which a person means as a number of bytes.
    if let Some((m, e)) = t
        .split_once(['e', 'E'])
        .filter(|(m, e)| !m.is_empty() && m.parse::<f64>().is_ok() && e.parse::<i32>().is_ok())
    {
        let shown = t
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 1.0 && *v < 1e19 && v.fract() == 0.0);
        return Err(match shown {
            Some(v) => format!("{m}e{e} is a float's notation; write the bytes ({v:.0}) or use a unit (K, M, G, T)"),
            None => format!("{m}e{e} is a float's notation; write a whole number of bytes or use a unit (K, M, G, T)"),
        });
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let shift = match unit.as_str() {
        "" | "b" => 0,
        "k" | "kb" | "ki" | "kib" => 10,
        "m" | "mb" | "mi" | "mib" => 20,
        "g" | "gb" | "gi" | "gib" => 30,
        "t" | "tb" | "ti" | "tib" => 40,
        "p" | "pb" | "pi" | "pib" => 50,
        _ => return Err(format!("unknown unit {unit:?}")),
    };
    if num.is_empty() || num.starts_with('.') || num.ends_with('.') || num.matches('.').count() > 1
    {
        return Err("expected a number".into());
    }
    let (whole, frac) = num.split_once('.').unwrap_or((num, ""));
    if !frac.is_empty() && shift == 0 {
        return Err("a fractional size needs a unit".into());
    }
    let whole: u64 = whole.parse().map_err(|_| "number too large".to_string())?;
    let mut bytes = whole
        .checked_shl(shift)
        .filter(|v| v >> shift == whole)
        .ok_or("size too large")?;
    if !frac.is_empty() {
        // Exact decimal arithmetic on the fraction's digits: "1.5G" must be 1610612736, not a float
        // rounding of it.
        let digits = &frac[..frac.len().min(18)];
        let f: u128 = digits
            .parse()
            .map_err(|_| "expected a number".to_string())?;
        let extra = (f << shift) / 10u128.pow(digits.len() as u32);
        bytes = bytes.checked_add(extra as u64).ok_or("size too large")?;
    }
    Ok(bytes)
}

/// `parse_size`, or `N%` with 0 < N <= 100.
pub fn parse_size_spec(text: &str) -> Result<SizeSpec, String> {
    let t = text.trim();
    if let Some(p) = t.strip_suffix('%') {
        let v: f64 = p
            .trim()
            .parse()
            .map_err(|_| format!("{p:?} is not a percentage"))?;
        if !(v > 0.0 && v <= 100.0) {
            return Err("a percentage must be above 0 and at most 100".into());
        }
        return Ok(SizeSpec::Percent(v));
    }
    parse_size(t).map(SizeSpec::Bytes)
}

pub const DURATION_FORMS: &str = "a duration such as 500ms, 30s, 5m, 1h";

/// Parses `500ms`, `30s`, `5m`, `1h` into milliseconds; zero is refused (it would spin).
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| "expected a whole number with a unit".to_string())?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "ms" => 1,
        "s" => 1000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        "" => return Err("missing unit".into()),
        u => return Err(format!("unknown unit {u:?}")),
    };
    let ms = n.checked_mul(mult).ok_or("duration too large")?;
    if ms == 0 {
        return Err("must be above zero".into());
    }
    Ok(ms)
}

/// `1.5 GiB`, `512 B`: binary units, three significant figures.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if v >= 100.0 {
        format!("{v:.0} {}", UNITS[i])
    } else if v >= 10.0 {
        format!("{v:.1} {}", UNITS[i])
    } else {
        format!("{v:.2} {}", UNITS[i])
    }
}

/// A signal pinguard may take for reports: `USR1`, `SIGUSR1`, `RTMIN+2` or a number; never one
/// that ends or stops a process whatever its handler (`KILL`, `STOP`) or that reports a fault.
pub fn parse_signal(s: &str) -> Result<i32, String> {
    let t = s.trim();
    let sig = if let Ok(n) = t.parse::<i32>() {
        n
    } else {
        let up = t.to_ascii_uppercase();
        let name = up.strip_prefix("SIG").unwrap_or(&up);
        match name {
            "HUP" => libc::SIGHUP,
            "INT" => libc::SIGINT,
            "QUIT" => libc::SIGQUIT,
            "USR1" => libc::SIGUSR1,
            "USR2" => libc::SIGUSR2,
            "ALRM" => libc::SIGALRM,
            "TERM" => libc::SIGTERM,
            "CHLD" => libc::SIGCHLD,
            "CONT" => libc::SIGCONT,
            "URG" => libc::SIGURG,
            "WINCH" => libc::SIGWINCH,
            "PWR" => libc::SIGPWR,
            // Named so that the answer is why they are refused, not that they are unknown.
            "KILL" => libc::SIGKILL,
            "STOP" => libc::SIGSTOP,
            "SEGV" => libc::SIGSEGV,
            "BUS" => libc::SIGBUS,
            "ILL" => libc::SIGILL,
            "FPE" => libc::SIGFPE,
            _ => match name
                .strip_prefix("RTMIN+")
                .and_then(|n| n.parse::<i32>().ok())
            {
                Some(n) => libc::SIGRTMIN() + n,
                None => return Err(format!("unknown signal {t:?}")),
            },
        }
    };
    if sig <= 0 || sig > libc::SIGRTMAX() {
        return Err(format!("{sig} is not a signal number"));
    }
    if matches!(
        sig,
        libc::SIGKILL | libc::SIGSTOP | libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE
    ) {
        return Err(format!("signal {sig} ({t}) cannot be caught safely"));
    }
    Ok(sig)
}

/// `PINGUARD_DOWNGRADE_MATCH`'s patterns: comma-separated globs, at least one.
pub fn parse_patterns(v: &str) -> Result<Vec<glob::Pattern>, String> {
    let mut out = Vec::new();
    for p in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        out.push(glob::Pattern::new(p).map_err(|e| format!("bad pattern {p:?}: {e}"))?);
    }
    if out.is_empty() {
        return Err("names no pattern".into());
    }
    Ok(out)
}

/// A report or metrics path template as the library expands it (`output::files`): `%p`, `%e`,
/// `%h`, `%t` and `%%`, naming a file.
pub fn check_template(t: &str) -> Result<(), String> {
    if t.trim().is_empty() {
        return Err("empty".into());
    }
    let mut chars = t.chars();
    while let Some(ch) = chars.next() {
        if ch == '%' {
            match chars.next() {
                Some('p' | 'e' | 'h' | 't' | 'n' | '%') => {}
                Some(o) => return Err(format!("unknown escape \"%{o}\"")),
                None => return Err("ends with a lone %; write %% for a literal %".into()),
            }
        }
    }
    if t.ends_with('/') {
        return Err("names a directory, not a file".into());
    }
    // `a/%p/../b` would be `a/b` once `a/1234` exists, or reach anywhere through a folder an
    // expansion names: the folders a template names are its own words.
    let mut expanded = false;
    for part in t.split('/') {
        if part == ".." && expanded {
            return Err("\"..\" after an expansion".into());
        }
        expanded |= part.contains('%');
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1073741824"), Ok(1 << 30));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("512mib"), Ok(512 << 20));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        assert_eq!(parse_size("64kb"), Ok(64 << 10));
        assert_eq!(parse_size(" 7 B "), Ok(7));
        assert_eq!(parse_size("0.5k"), Ok(512));
        // Kubernetes' binary suffixes, as a manifest writes them.
        for (k8s, bytes) in [
            ("64Ki", 64u64 << 10),
            ("3Mi", 3 << 20),
            ("8Gi", 8 << 30),
            ("1.5Gi", 3 << 29),
            ("1Ti", 1 << 40),
            ("1Pi", 1 << 50),
            ("8gi", 8 << 30),
        ] {
            assert_eq!(parse_size(k8s), Ok(bytes), "{k8s}");
        }
        assert!(parse_size("16384Pi").is_err(), "2^64 does not fit");
        for bad in [
            "",
            "M",
            "12Q",
            "1.5",
            "-1",
            "1..5G",
            ".5G",
            "99999999999999999999",
            "16777216T",
            "1e9",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(
            parse_size("-1").unwrap_err(),
            "negative sizes are not allowed"
        );
        assert_eq!(
            parse_size(" -5G").unwrap_err(),
            "negative sizes are not allowed"
        );
        assert_eq!(
            parse_size("1e9").unwrap_err(),
            "1e9 is a float's notation; write the bytes (1000000000) or use a unit (K, M, G, T)"
        );
        assert!(parse_size("1.5E3")
            .unwrap_err()
            .contains("write the bytes (1500)"));
        assert!(parse_size("1e-3")
            .unwrap_err()
            .contains("write a whole number of bytes"));
    }

    #[test]
    fn size_specs() {
        assert_eq!(parse_size_spec("50%"), Ok(SizeSpec::Percent(50.0)));
        assert_eq!(parse_size_spec("12.5 %"), Ok(SizeSpec::Percent(12.5)));
        assert_eq!(parse_size_spec("1G"), Ok(SizeSpec::Bytes(1 << 30)));
        assert!(parse_size_spec("0%").is_err());
        assert!(parse_size_spec("101%").is_err());
        assert!(parse_size_spec("x%").is_err());
        assert_eq!(
            parse_size_spec("-1").unwrap_err(),
            "negative sizes are not allowed"
        );
        assert_eq!(
            parse_size_spec("-5%").unwrap_err(),
            "a percentage must be above 0 and at most 100"
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("500ms"), Ok(500));
        assert_eq!(parse_duration_ms("30s"), Ok(30_000));
        assert_eq!(parse_duration_ms("5m"), Ok(300_000));
        for bad in ["", "5", "0s", "1.5s", "s", "5d", "-1s"] {
            assert!(parse_duration_ms(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn signals() {
        assert_eq!(parse_signal("usr1"), Ok(libc::SIGUSR1));
        assert_eq!(parse_signal("SIGUSR2"), Ok(libc::SIGUSR2));
        assert_eq!(parse_signal("12"), Ok(12));
        assert!(parse_signal("KILL")
            .unwrap_err()
            .contains("cannot be caught"));
        assert!(parse_signal("FOO").unwrap_err().contains("unknown signal"));
        assert!(parse_signal("0").is_err());
    }

    #[test]
    fn templates_and_patterns() {
        assert!(check_template("/r/%e-%p-%h-%t-%%.json").is_ok());
        assert!(check_template("/t/pinguard.%n.%p.prom").is_ok());
        assert!(check_template("/etc/%p/../profile")
            .unwrap_err()
            .contains("after an expansion"));
        assert!(
            check_template("../r/%e.%p.json").is_ok(),
            "the user's own words"
        );
        assert!(check_template("/r/%q.json").unwrap_err().contains("\"%q\""));
        assert!(check_template("/r/out%").unwrap_err().contains("lone %"));
        assert!(check_template("r/")
            .unwrap_err()
            .contains("names a directory"));
        assert!(check_template(" ").is_err());
        assert_eq!(parse_patterns(" *a*, b ").map(|p| p.len()), Ok(2));
        assert!(parse_patterns(",")
            .unwrap_err()
            .contains("names no pattern"));
        assert!(parse_patterns("[").unwrap_err().contains("bad pattern"));
    }

    #[test]
    fn human_bytes() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1536), "1.50 KiB");
        assert_eq!(format_bytes(3 << 29), "1.50 GiB");
        assert_eq!(format_bytes(200 << 20), "200 MiB");
    }
}
