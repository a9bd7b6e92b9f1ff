//! The container a process runs in, as its cgroup path names it: the `container_id` label.
//!
//! Every engine names a container's cgroup after its 64-hex-digit id: `/docker/<id>` (cgroupfs
//! driver), `docker-<id>.scope` (systemd driver), `cri-containerd-<id>.scope`, `crio-<id>.scope`,
//! `libpod-<id>.scope` (podman, whose processes may sit one level below, in `container`),
//! `/kubepods/<qos>/pod<uid>/<id>`. The engines' own monitors (`libpod-conmon-<id>.scope`,
//! `crio-conmon-<id>.scope`) are not the container. A container with its own cgroup namespace
//! sees `0::/` and no id: then there is no label (the downward API's `pod` and `container` still
//! say which container it is).

/// The deepest container id in a `/proc/self/cgroup` text (cgroup v1 lines `N:controllers:path`,
/// v2 `0::path`), the first line that names one; `None` outside a container.
pub fn container_id(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        path.rsplit('/').find_map(component_id)
    })
}

/// The id one path component names, if it names a container.
fn component_id(c: &str) -> Option<String> {
    if c.contains("conmon") {
        return None;
    }
    let c = c.strip_suffix(".scope").unwrap_or(c);
    let id = c.rsplit('-').next()?;
    (id.len() == 64
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    .then(|| id.to_string())
}

#[cfg(test)]
mod tests {
    use super::container_id;

    const ID: &str = "3f1c5b0e4a2d9c8b7a6f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a09";

    /// `/proc/self/cgroup` as each engine leaves it, cgroup v1 and v2.
    #[test]
    fn every_engines_cgroup_names_its_container() {
        let cases = [
            // Docker, cgroupfs driver, cgroup v1 (a few controllers, as the file lists them).
            format!("12:pids:/docker/{ID}\n11:memory:/docker/{ID}\n1:name=systemd:/docker/{ID}\n0::/system.slice/containerd.service\n"),
            // Docker, systemd driver, cgroup v2 with the host's cgroup namespace.
            format!("0::/system.slice/docker-{ID}.scope\n"),
            // Kubernetes with containerd, systemd driver, cgroup v2.
            format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod8c4a1b2e_0d3f_4a5b_9c6d_7e8f9a0b1c2d.slice/cri-containerd-{ID}.scope\n"),
            // Kubernetes, cgroupfs driver, cgroup v1.
            format!("11:memory:/kubepods/besteffort/pod8c4a1b2e-0d3f-4a5b-9c6d-7e8f9a0b1c2d/{ID}\n10:cpu,cpuacct:/kubepods/besteffort/pod8c4a1b2e-0d3f-4a5b-9c6d-7e8f9a0b1c2d/{ID}\n"),
            // CRI-O, systemd driver, v1 and v2.
            format!("0::/kubepods.slice/kubepods-pod1.slice/crio-{ID}.scope\n"),
            format!("4:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/crio-{ID}.scope\n"),
            // podman, rootful and rootless, the processes in the scope's `container` child.
            format!("0::/machine.slice/libpod-{ID}.scope/container\n"),
            format!("0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope\n"),
            // Nested: the innermost container.
            format!("0::/docker/{}/docker/{ID}\n", "a".repeat(64)),
        ];
        for text in &cases {
            assert_eq!(container_id(text).as_deref(), Some(ID), "{text}");
        }
    }

    #[test]
    fn no_container_no_id() {
        for text in [
            "0::/\n",
            "0::/user.slice/user-0.slice/session-3.scope\n",
            "4:memory:/process_api/2f3596299fe8f2dafb2112b2addc288b\n0::/\n",
            // A monitor process of the engine's, not the container.
            &format!("0::/machine.slice/libpod-conmon-{ID}.scope\n"),
            &format!("0::/kubepods.slice/crio-conmon-{ID}.scope\n"),
            // Not hex, or not 64 digits.
            &format!("0::/docker/{}\n", ID.replace('a', "g")),
            &format!("0::/docker/{}\n", &ID[1..]),
            "",
            "garbage without colons",
        ] {
            assert_eq!(container_id(text), None, "{text}");
        }
    }
}
