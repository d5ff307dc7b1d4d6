//! TODO(helper): tables of this module.

use crate::Generator;

pub(crate) const TABLES: &[(&str, Generator)] = &[];
