//! placeholder; the helper owning this file replaces it.
