"""Every read and write of a file or stream: read (vetting, .npy/.npz, stdin, pipes, out-of-core blocks) and
write (destinations vetted, temp files, all-or-nothing commit, FIFOs and devices written through)."""
