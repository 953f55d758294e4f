//! The reviews (`pkg/registry/authentication/tokenreview`, `.../selfsubjectreview`,
//! `pkg/registry/authorization/*`):
//! create-only resources that are answered and never stored. Their strategy only says which
//! review a resource is; [`crate::reviews`] answers it.

use super::Strategy;

/// Which review a resource answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Review {
    /// TokenReview: who a bearer token is.
    Token,
    /// An access review: may a user do that? `of_requester` for SelfSubjectAccessReview,
    /// which asks about whoever sends it; the others ask about the user their spec names.
    Access { of_requester: bool },
    /// SelfSubjectReview (`kubectl auth whoami`): the requester's own user info.
    SelfSubject,
}

/// The strategy of one review resource.
pub struct ReviewStrategy(Review);

impl Strategy for ReviewStrategy {
    fn review(&self) -> Option<Review> {
        Some(self.0)
    }
}

pub static TOKEN_REVIEW: ReviewStrategy = ReviewStrategy(Review::Token);
pub static SELF_SUBJECT_REVIEW: ReviewStrategy = ReviewStrategy(Review::SelfSubject);
pub static SUBJECT_ACCESS_REVIEW: ReviewStrategy = ReviewStrategy(Review::Access {
    of_requester: false,
});
pub static LOCAL_SUBJECT_ACCESS_REVIEW: ReviewStrategy = ReviewStrategy(Review::Access {
    of_requester: false,
});
pub static SELF_SUBJECT_ACCESS_REVIEW: ReviewStrategy =
    ReviewStrategy(Review::Access { of_requester: true });
